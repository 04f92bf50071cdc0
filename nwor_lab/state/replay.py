"""`replay`: the window runs from the committed state without writing it; its layer inputs are kept,
and commit recomputes the state over the accepted rows only (ReplaySSM in vLLM, TensorRT-LLM). A
rollback costs nothing; every commit costs a recurrence over the accepted rows."""
from __future__ import annotations

from nwor_lab.state.policy import StatePolicy


class ReplayState(StatePolicy):
    keeps_window_inputs = True

    @classmethod
    def transient_bytes_per_request(cls, k, spec):
        return (k + 1) * spec.token_input_bytes

    def _begin(self):
        self._inputs = {}

    def _state_out(self, layer, r, kept, inputs, scale):
        if self.segments[r].drafts == 0:          # nothing to roll back: write as off does
            self._write_live(layer, r, state=kept[-1])
        else:
            self._inputs.setdefault((layer, r), [None, None])[0] = (inputs, scale)

    def _conv_out(self, layer, r, history):
        if self.segments[r].drafts == 0:
            self._write_live(layer, r, conv=history[-(self.spec.conv_width - 1):])
        else:
            self._inputs.setdefault((layer, r), [None, None])[1] = history[self.spec.conv_width - 1:]

    def _replay(self, rows_of):
        kept = sum(t.nbytes for (inputs, _), x in self._inputs.values() for t in (*inputs, x))
        self._note_kept(kept)
        for (layer, r), ((inputs, scale), x) in self._inputs.items():
            state, conv = self.store.committed(self.segments[r].slot, layer)
            state, conv = self._readvance(layer, r, state, conv, inputs, x, rows_of(self.segments[r], r), scale)
            self._write_live(layer, r, state=state, conv=conv)
        self._inputs = {}

    def _commit(self, accepted):
        self._replay(lambda seg, r: seg.end_row(accepted[r]) + 1)

    def _cancel(self):
        self._replay(lambda seg, r: seg.rows)
