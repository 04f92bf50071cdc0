"""The recurrent and conv state of a hybrid model's linear-attention layers, as a store of the cache,
and the strategies that keep it across a verify window (policy.py gives the interface).

| strategy    | during the window                         | at commit                              | like |
| `off`       | live state advances through every row     | nothing: rejected drafts stay in it    | the bug |
| `snapshots` | state after each position in its own row  | move `current` to the accepted row     | vLLM |
| `cow`       | checkpoint, then advance live             | on reject: restore, re-advance         | llama.cpp |
| `replay`    | keep the layer inputs, live untouched     | recompute over the accepted rows       | ReplaySSM, TensorRT-LLM |
| `stage`     | states after each position, transient     | copy the accepted position's state     | SGLang's intermediate states, NWOR |

`LabConfig.state_mode` picks one (`auto`: the write policy's declared `state_counterpart`, resolved by
`nwor_lab.engine.choices.Choices.state_config`, which sits above both packages). What the state is and
how rows advance it is the spec's `Recurrence` (recurrence.py): gated DeltaNet (gated_delta.py) by
default, a Mamba2 selective scan (mamba2.py) beside it; every strategy runs either.
"""
from __future__ import annotations

from nwor_lab.config import LabConfig, check_config
from nwor_lab.state.memory import memory_rows, qwen3_next_spec
from nwor_lab.state.gated_delta import GatedDeltaRecurrence
from nwor_lab.state.policy import Group, StatePolicy, StateWindowError
from nwor_lab.state.recurrence import Recurrence
from nwor_lab.state.cow import CowState
from nwor_lab.state.off import OffState
from nwor_lab.state.registry import STATE_POLICIES, register_state_policy
from nwor_lab.state.replay import ReplayState
from nwor_lab.state.snapshots import SnapshotsState
from nwor_lab.state.stage import StageState
from nwor_lab.state.store import RecurrentSpec, RecurrentStateStore

def state_policy_class(config: LabConfig) -> type[StatePolicy]:
    """The strategy `config.state_mode` names. `auto` is not resolved here: it is the write policy's
    declared `state_counterpart`, which this package does not see (it never imports the policies);
    `nwor_lab.engine.choices.Choices.of(config).state_config()` resolves it."""
    config = check_config("config", config)
    if config.state_mode == "auto":
        raise ValueError("state_mode='auto' names the write policy's declared state counterpart, which only the "
                         "engine resolves: pass Choices.of(config).state_config() (nwor_lab.engine.choices) or "
                         f"set LabConfig.state_mode to one of {', '.join(STATE_POLICIES)}")
    return STATE_POLICIES[config.state_mode]


def make_state_store(config: LabConfig, spec: RecurrentSpec, num_slots: int, k: int, device="cpu",
                     scratch_slot: int | None = None):
    """A store with the rows per slot the selected strategy needs for windows of up to k drafts
    (`scratch_slot`: see RecurrentStateStore)."""
    return RecurrentStateStore(spec, num_slots, state_policy_class(config).rows_per_slot(k), device,
                               scratch_slot=scratch_slot)


def make_state_policy(config: LabConfig, store: RecurrentStateStore) -> StatePolicy:
    """The state policy `config` selects, over `store` (its backend: `config.backend`)."""
    return state_policy_class(config)(store, backend=config.backend, validate=config.validate)


__all__ = ["STATE_POLICIES", "register_state_policy", "state_policy_class", "make_state_store",
           "make_state_policy", "StatePolicy", "StateWindowError", "Group", "RecurrentSpec",
           "RecurrentStateStore", "Recurrence", "GatedDeltaRecurrence", "memory_rows", "qwen3_next_spec",
           "OffState", "SnapshotsState", "CowState", "ReplayState", "StageState"]
