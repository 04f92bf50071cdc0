"""`stage`: the states after t_last, d_1 .. d_k are transient (one buffer per window, as SGLang's
`intermediate_states_buffer`); commit writes only the accepted position's state, and the conv state
it keeps is a slice of the window's conv history. The store only ever receives accepted state
(NWOR), holds one row per request, and commit is one gather and one copy per layer and group."""
from __future__ import annotations

from nwor_lab.state.policy import StatePolicy


class StageState(StatePolicy):
    keeps_window_states = True

    @classmethod
    def transient_bytes_per_request(cls, k, spec):
        return (k + 1) * spec.num_layers * spec.state_bytes_layer \
            + (spec.conv_width - 1 + k + 1) * spec.num_layers * spec.conv_dim * spec.dtype.itemsize

    def _begin(self):
        self._states, self._histories = {}, {}

    def _state_out(self, layer, grp, kept, inputs, options):
        self._states[layer, grp] = kept

    def _conv_out(self, layer, grp, history):
        if grp.index is None:
            # what any candidate's conv state can need: from the row after t_last's first input on
            fc = grp.first_candidate
            self._histories[layer, grp] = (history[:, fc + 1:], -(fc + 1))
        else:
            self._histories[layer, grp] = (history, 0)

    def _commit(self, accepted):
        """accepted `[R]` (device): candidate a of each request commits (a = its accepted drafts)."""
        self._note_kept(sum(t.nbytes for t in self._states.values())
                        + sum(h.nbytes for h, _ in self._histories.values()))
        for (layer, grp), states in self._states.items():
            a = accepted[grp.reqs]
            history, shift = self._histories[layer, grp]
            self._write_live(layer, grp, state=self._candidate_states(grp, states, a),
                             conv=self._conv_after(history, grp.first_candidate + a + shift))
        self._states, self._histories = {}, {}
