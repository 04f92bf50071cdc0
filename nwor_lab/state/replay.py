"""`replay`: the window runs from the committed state without writing it; its layer inputs are kept,
and commit recomputes the state over the accepted rows only (ReplaySSM in vLLM, TensorRT-LLM). A
rollback costs nothing; every commit costs a recurrence over the accepted rows (here one
fixed-shape run over t_last + k rows with the rejected ones masked to identity, as a captured step
needs; a kernel stops at the accepted row instead)."""
from __future__ import annotations

from nwor_lab.state.policy import StatePolicy


class ReplayState(StatePolicy):
    keeps_window_inputs = True

    @classmethod
    def transient_bytes_per_request(cls, k, spec):
        return (k + 1) * spec.token_input_bytes

    def _begin(self):
        self._inputs = {}

    def _state_out(self, layer, grp, kept, inputs, options):
        if not grp.speculative:                    # nothing to roll back: write as off does
            self._write_live(layer, grp, state=kept[:, -1])
        else:
            self._inputs.setdefault((layer, grp), [None, None])[0] = (inputs, options)

    def _conv_out(self, layer, grp, history):
        if not grp.speculative:
            self._write_live(layer, grp, conv=self._conv_after(history, grp.last_row))
        else:
            self._inputs.setdefault((layer, grp), [None, None])[1] = history[:, self.spec.conv_width - 1:]

    def _commit(self, accepted):
        """Recompute each speculative request from its committed state over t_last, d_1 .. d_a."""
        self._note_kept(sum(t.nbytes for (inputs, _), x in self._inputs.values() for t in (*inputs, x)))
        for (layer, grp), ((inputs, options), x) in self._inputs.items():
            state, conv = self._state_in(layer, grp), self._conv_in(layer, grp)
            end_rows = grp.first_candidate + accepted[grp.reqs]
            state, conv = self._readvance(state, conv, inputs, x, end_rows, options)
            self._write_live(layer, grp, state=state, conv=conv)
        self._inputs = {}
