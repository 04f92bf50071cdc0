"""The auditor's stores for K/V that leaves the device (CPU, a few tokens): `host_tier` (blocks that
come back from host memory) and `handoff` (what a decode engine receives). Silent for the exact
strategies; named, with the store, for the field's failures and for planted faults: `target_only`
offload (the head's layers come back as zeros), a host copy corrupted in the pool, `write_all`
under write-all (rejected rows ship), `no_head`, `no_state`, a frame corrupted on its way."""
import pytest
import torch

from nwor_lab.audit import load_pair, toy_hybrid_pair
from nwor_lab.audit.conversations import conversations
from nwor_lab.audit.moved import audit_handoff
from nwor_lab.audit.prefix_run import audit_conversations
from nwor_lab.audit.report import STORES
from nwor_lab.config import LabConfig
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.model.toy import toy_pair


@pytest.fixture(scope="module")
def tiny():
    return load_pair("tiny")


def host_audit(pair, offload, observers=()):
    """Three 2-turn conversations, one request at a time in 16 device blocks: the second turns hit
    blocks that went to the host tier."""
    return audit_conversations(LabConfig(nwor_mode="off"), pair, conversations(pair, 3, 2, 20), 6, block_size=4,
                               num_blocks=16, max_num_seqs=1, observers=observers,
                               prefix_cache=PrefixCacheConfig(host_blocks=64, offload=offload))


def test_host_tier_is_a_store_and_target_head_leaves_it_clean(tiny):
    assert STORES[-2:] == ("host_tier", "handoff")
    report = host_audit(tiny, "target_head")
    s = report.store("host_tier")
    assert report.run["prefix"]["host_restores"] > 0 and s.rows_checked > 0
    assert s.status == "clean" and "host_tier" not in report.reached and report.first_divergence is None
    assert report.store("handoff").status == "absent"


def test_target_only_offload_is_named_by_its_store(tiny):
    report = host_audit(tiny, "target_only")
    s = report.store("host_tier")
    assert s.status == "reached" and s.window_kind == "restore"
    assert s.detail["why"] == "differs_from_what_left" and s.detail["store"] == "head layers"
    assert s.detail["offload"] == "target_only"
    assert report.first_divergence is None                  # the target verifies: tokens stay exact


class CorruptThePool:
    """After every window, one element of the target's layer 0 of each block that reached the host
    since (a host copy gone bad)."""

    def __init__(self):
        self.done = set()

    def on_phase(self, e):
        pass

    def on_window_end(self, engine, trace, window):
        pool = engine.prefix.host.pool
        for h, slot in pool.slot_of.items():
            if h not in self.done:
                pool.key[slot, 0, 0, 0, 0] += 1.0
                self.done.add(h)


def test_a_corrupted_host_copy_is_named(tiny):
    report = host_audit(tiny, "target_head", observers=[CorruptThePool()])
    s = report.store("host_tier")
    assert s.status == "reached" and s.detail["store"] == "target layers"
    assert s.detail["why"] == "differs_from_what_left"


# -- the hand-off ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy():
    return toy_pair(0)


def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 16, (m,), generator=g).tolist() for m in (5, 9, 2, 8)]


def handoff_audit(pair, strategy, mode="off", **kw):
    target, head = pair
    return audit_handoff(target, head, LabConfig(nwor_mode=mode), prompts(), 10, strategy, k=3, block_size=4, **kw)


@pytest.mark.parametrize("strategy,mode", [("nwor", "off"), ("nwor", "stage"), ("write_all", "stage")])
def test_exact_hand_offs_leave_the_store_clean(toy, strategy, mode):
    report = handoff_audit(toy, strategy, mode)
    s = report.store("handoff")
    assert s.status == "clean" and s.rows_checked > 0 and report.first_divergence is None


def test_write_all_under_write_all_ships_rejected_rows_and_is_named(toy):
    report = handoff_audit(toy, "write_all", "off")
    s = report.store("handoff")
    assert s.status == "reached" and s.detail["why"] == "rejected_row_shipped"
    assert toy[0].num_layers in s.detail["layers"]          # the head's layer: the draft chain's rows
    assert report.run["junk_rows"] > 0 and report.first_divergence is None


def test_no_head_is_named_for_the_heads_layer(toy):
    report = handoff_audit(toy, "no_head", "stage")
    s = report.store("handoff")
    assert s.status == "reached" and s.detail["why"] == "head_differs_from_target_only"
    assert s.detail["layer"] == toy[0].num_layers
    assert report.first_divergence is None                  # greedy: the target verifies


def test_a_frame_corrupted_on_its_way_is_named_by_layer_and_position(toy):
    def corrupt(shipments):
        shipments[1].tensors["value.1"][6] += 1.0
    s = handoff_audit(toy, "nwor", "stage", corrupt=corrupt).store("handoff")
    assert s.status == "reached" and s.detail["why"] == "differs_from_target_only"
    assert (s.detail["request"], s.detail["layer"], s.detail["position"], s.detail["block"]) == (1, 1, 6, 1)


def test_no_state_is_named_for_the_state():
    pair = toy_hybrid_pair()
    report = audit_handoff(pair.target, pair.head, LabConfig(nwor_mode="stage", state_mode="stage"), prompts(), 8,
                           "no_state", k=3, block_size=4)
    s = report.store("handoff")
    assert s.status == "reached" and s.detail["why"] == "state_differs_from_target_only"
    assert s.detail["shipped"] is False
    nwor = audit_handoff(pair.target, pair.head, LabConfig(nwor_mode="stage", state_mode="stage"), prompts(), 8,
                         "nwor", k=3, block_size=4)
    assert nwor.store("handoff").status == "clean" and nwor.first_divergence is None


# -- a hybrid's state checkpoints through the host tier ---------------------------------------------
class CorruptTheCheckpoints(CorruptThePool):
    """As CorruptThePool, in the state checkpoint that travels with each block."""

    def on_window_end(self, engine, trace, window):
        pool = engine.prefix.host.pool
        for h, slot in pool.slot_of.items():
            if h not in self.done:
                pool.rows["state.recurrent"][slot] += 1.0
                self.done.add(h)


@pytest.mark.parametrize("fault", [None, CorruptTheCheckpoints])
def test_a_hybrids_state_checkpoints_through_the_host_tier_are_audited(fault):
    pair = toy_hybrid_pair()
    report = audit_conversations(LabConfig(nwor_mode="stage", state_mode="stage"), pair, conversations(pair, 3, 2, 12),
                                 6, block_size=4, num_blocks=10, max_num_seqs=1,
                                 observers=[fault()] if fault else (),
                                 prefix_cache=PrefixCacheConfig(host_blocks=64, offload="target_head_state"))
    s = report.store("host_tier")
    assert report.run["prefix"]["host_restores"] > 0 and s.rows_checked > 0
    if fault is None:
        assert report.reached == [] and report.first_divergence is None
    else:
        assert s.status == "reached" and s.detail["store"] == "state.recurrent"
