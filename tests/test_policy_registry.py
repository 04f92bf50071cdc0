"""A new write policy is one class plus one registry line; the engine, the model and the
invariants use it through what it declares, never through its name."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.config import NWOR_MODES
from nwor_lab.engine import generate
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.toy import toy_pair
from nwor_lab.policies import POLICIES, LogObserver, WritePolicy, make_policy, register_policy
from nwor_lab.policies.invariants import check_invariants, off_reference, random_window, run_window
from nwor_lab.ops import write_kv


class WriteTwicePolicy(WritePolicy):
    """A throwaway policy: writes every row straight into the cache (like `off`), counting writes.
    Defined here, registered below: nothing else in the package knows it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_writes = 0

    def _write(self, layer, key, value, token_offset) -> None:
        self.layer_writes += 1
        slots = self.window.slot_mapping[token_offset:token_offset + key.shape[0]]
        write_kv(key, value, *self.cache.layer(layer), slots, *self.cache.layer_scales(layer))


@pytest.fixture(scope="module")
def throwaway():
    register_policy("throwaway", WriteTwicePolicy)
    yield "throwaway"
    POLICIES.pop("throwaway")


def test_registry_holds_exactly_the_builtins_plus_registered(throwaway):
    assert set(NWOR_MODES) <= set(POLICIES) and throwaway in POLICIES
    assert LabConfig(nwor_mode=throwaway).nwor_mode == throwaway
    with pytest.raises(TypeError, match="WritePolicy subclass"):
        register_policy("bad", object)


def test_throwaway_policy_keeps_the_invariants(throwaway):
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVCache(KVCacheSpec(2, 16, 4, 2, 8))
    before = cache.snapshot()
    rw = random_window(cache, gen, num_reqs=5)
    policy = make_policy(LabConfig(nwor_mode=throwaway), cache)
    rec = run_window(policy, rw, chunks=2)
    assert rec.mode == throwaway and policy.layer_writes == 4
    assert check_invariants(policy, cache, before, off_reference(cache, before, rw), rw) == []


def test_engine_runs_a_throwaway_policy(throwaway):
    target, head = toy_pair(0)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    ref = generate(prompts, max_new_tokens=10, k=0, target=target, head=head).token_ids
    log = LogObserver()
    res = generate(prompts, max_new_tokens=10, k=3, config=LabConfig(nwor_mode=throwaway, debug=True),
                   target=target, head=head, observers=[log])
    assert res.token_ids == ref, "greedy speculative decoding gives the target-only tokens"
    assert res.engine.policy.layer_writes > 0 and res.engine.drafter.policy.layer_writes > 0
    phases = {line.split()[2] for line in log.lines}    # "<policy> <kind> <phase> ..."
    assert phases == {"begin", "write", "acceptance", "commit"}
    assert any(line.startswith(f"{throwaway} draft begin") for line in log.lines)


def test_every_policy_is_a_kv_writer():
    from nwor_lab.model.writer import KVWriter
    cache = PagedKVCache(KVCacheSpec(1, 4, 4, 1, 4))
    for name in NWOR_MODES:
        assert isinstance(make_policy(LabConfig(nwor_mode=name), cache), KVWriter)


def test_the_registries_list_the_builtins_config_checks_first():
    """config names the built-ins only to check a LabConfig without importing policies / state; the
    registries register exactly those first, in that order (so the two cannot drift apart)."""
    from nwor_lab.config import STATE_MODES, nwor_modes, state_modes
    from nwor_lab.state import STATE_POLICIES
    assert tuple(POLICIES)[:len(NWOR_MODES)] == NWOR_MODES and nwor_modes() == tuple(POLICIES)
    assert tuple(STATE_POLICIES) == STATE_MODES[1:] and state_modes() == STATE_MODES


def test_nothing_but_config_reads_the_builtin_name_tuples():
    """Flags, benches and chapters list names from the registries (`nwor_modes()`, `state_modes()`,
    POLICIES, STATE_POLICIES), never config's built-in tuples: a registered policy reaches them all."""
    import ast
    from pathlib import Path
    package = Path(__file__).resolve().parents[1] / "nwor_lab"
    readers = []
    for path in package.rglob("*.py"):
        if path.name == "config.py" and path.parent == package:
            continue
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)
                  for a in n.names}
        if names & {"NWOR_MODES", "STATE_MODES"}:
            readers.append(str(path.relative_to(package)))
    assert readers == [], f"read nwor_modes() / state_modes() (or the registries) instead: {readers}"


def test_a_popped_policy_leaves_the_config_names():
    class Gone(WriteTwicePolicy):
        pass
    register_policy("gone", Gone)
    assert "gone" in nwor_modes_now() and LabConfig(nwor_mode="gone").nwor_mode == "gone"
    POLICIES.pop("gone")
    assert "gone" not in nwor_modes_now()
    with pytest.raises(ValueError, match="LabConfig.nwor_mode='gone': choose one of off, cow, stage"):
        LabConfig(nwor_mode="gone")


def nwor_modes_now():
    from nwor_lab.config import nwor_modes
    return nwor_modes()
