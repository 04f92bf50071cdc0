"""The state strategies by name (what `LabConfig.state_mode` selects); a new one is a StatePolicy
subclass plus one `register_state_policy(name, cls)` line."""
from __future__ import annotations

from nwor_lab.state.cow import CowState
from nwor_lab.state.off import OffState
from nwor_lab.state.policy import StatePolicy
from nwor_lab.state.replay import ReplayState
from nwor_lab.state.snapshots import SnapshotsState
from nwor_lab.state.stage import StageState

STATE_POLICIES: dict[str, type[StatePolicy]] = {}


def register_state_policy(name: str, cls: type[StatePolicy]) -> type[StatePolicy]:
    if not (isinstance(cls, type) and issubclass(cls, StatePolicy)):
        raise TypeError(f"register_state_policy({name!r}, ...): expected a StatePolicy subclass, got {cls!r}")
    cls.name = name
    STATE_POLICIES[name] = cls
    return cls


for _name, _cls in (("off", OffState), ("snapshots", SnapshotsState), ("cow", CowState),
                    ("replay", ReplayState), ("stage", StageState)):
    register_state_policy(_name, _cls)


