"""`off`: the live state advances through every row of the window, drafts included (the bug every
engine had to fix: a rejected draft's update stays in the state; the outputs go wrong from the next
window on)."""
from __future__ import annotations

from nwor_lab.state.policy import StatePolicy


class OffState(StatePolicy):
    advances_live = True
    commits_accepted_only = False

    def _state_out(self, layer, grp, kept, inputs, options):
        self._write_live(layer, grp, state=kept[:, -1])

    def _conv_out(self, layer, grp, history):
        self._write_live(layer, grp, conv=self._conv_after(history, grp.last_row))

    def _cancel(self, drafts):
        """Nothing to do: the live state already holds every row."""
