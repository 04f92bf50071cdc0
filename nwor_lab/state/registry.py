"""The state strategies by name (what `LabConfig.state_mode` selects); a new one is a StatePolicy
subclass plus one `register_state_policy(name, cls)` line."""
from __future__ import annotations

from nwor_lab.config import Registry, state_modes
from nwor_lab.state.cow import CowState
from nwor_lab.state.off import OffState
from nwor_lab.state.policy import StatePolicy
from nwor_lab.state.replay import ReplayState
from nwor_lab.state.snapshots import SnapshotsState
from nwor_lab.state.stage import StageState

# a Registry over config.state_modes: a registered strategy is a name LabConfig(state_mode=) accepts
STATE_POLICIES: Registry = Registry(state_modes, StatePolicy, "register_state_policy")


def register_state_policy(name: str, cls: type[StatePolicy]) -> type[StatePolicy]:
    """Make `cls` the strategy `LabConfig(state_mode=name)` selects."""
    return STATE_POLICIES.register(name, cls)


for _name, _cls in (("off", OffState), ("snapshots", SnapshotsState), ("cow", CowState),
                    ("replay", ReplayState), ("stage", StageState)):
    register_state_policy(_name, _cls)


