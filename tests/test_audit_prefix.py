"""The auditor's stores that outlive a window (shipped pair, CPU, a few tokens): the prefix cache,
the head's cache on a hit, swapped-out blocks; named for the failing strategy, silent for the exact
ones, and named for a fault injected into each."""
import json

import pytest
import torch

from nwor_lab.audit import load_pair, toy_hybrid_pair
from nwor_lab.audit.conversations import conversations, run_closed_loop
from nwor_lab.audit.prefix import SwapAudit
from nwor_lab.audit.prefix_run import audit_conversations
from nwor_lab.audit.report import STORES, StoreFinding
from nwor_lab.cli.main import main
from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.preemption import Preemption
from nwor_lab.engine.prefix import PrefixCacheConfig

SMALL = ["--block-size", "4", "--max-new-tokens", "6", "--system-tokens", "20", "--conversations", "3"]


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny")


def cli(capsys, *argv) -> dict:
    assert main(["audit", "--json", *SMALL, *argv]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [x["store"] for x in lines[:-1]] == list(STORES)
    return {x.get("store", "summary"): x for x in lines}


def test_cli_names_the_head_cache_for_missing_and_nothing_for_the_exact_strategies(capsys):
    missing = cli(capsys, "--prefix-cache", "--head-cache", "missing", "--turns", "1")
    assert missing["head_cache"]["status"] == "reached" and missing["prefix_cache"]["status"] == "clean"
    assert missing["head_cache"]["detail"]["max_abs_diff"] > 1.0        # zeros, not rounding
    assert missing["summary"]["first_divergence"] is None              # the target verifies: tokens exact
    for lookahead in ("boundary", "drop_last"):
        exact = cli(capsys, "--prefix-cache", "--head-cache", "cached", "--lookahead", lookahead, "--turns", "1",
                    "--nwor-mode", "stage")
        assert exact["prefix_cache"]["status"] == exact["head_cache"]["status"] == "clean"
        assert exact["summary"]["stores_reached"] == []                  # stage: no store at all
        assert exact["summary"]["prefix"]["hit_requests"] >= 2 and exact["summary"]["first_divergence"] is None


def test_returning_conversation_head_rows_equal_target_only(pair):
    """A middle hit block registered by a conversation that went on differently gets its head row fixed too."""
    report = audit_conversations(LabConfig(), pair, conversations(pair, 3, 2, 20), 6, block_size=4,
                                 prefix_cache=PrefixCacheConfig("cached", "boundary"))
    assert report.store("head_cache").status == "clean"


def test_swap_is_checked_and_a_corrupted_swap_in_is_named(pair):
    conv = conversations(pair, 4, 1, 20)
    report = audit_conversations(LabConfig(nwor_mode="cow"), pair, conv, 16, block_size=4, num_blocks=16,
                                 preemption=Preemption("swap"), prefix_cache=PrefixCacheConfig())
    assert report.run["preemption"]["preemptions"] >= 1 and report.store("swap").status == "clean"
    assert report.reached == [] and report.first_divergence is None     # hits beside a swap: every store clean
    # the same workload with the swapped-in bytes off by one in layer 0
    e = SpecEngine(pair.target, pair.head, LabConfig(), k=3, block_size=4, num_blocks=16, preemption=Preemption("swap"))
    resume = e.scheduler.on_resume

    def corrupt(r):
        resume(r)
        e.cache.key[0, r.block_table.blocks[0]] += 1.0
    e.scheduler.on_resume = corrupt
    findings = {"swap": StoreFinding("swap", True)}
    SwapAudit(e, findings)
    run_closed_loop(e, conv, 16)
    assert findings["swap"].status == "reached" and findings["swap"].detail["layer"] == 0


def test_a_hybrid_targets_swapped_state_slot_is_checked():
    pair = toy_hybrid_pair()
    report = audit_conversations(LabConfig(nwor_mode="stage"), pair, conversations(pair, 6, 1, 12), 16, block_size=4,
                                 num_blocks=12,
                                 preemption=Preemption("swap"))
    assert report.run["preemption"]["preemptions"] >= 1 and report.store("swap").status == "clean"
    assert report.reached == [] and report.first_divergence is None


class WriteRegistered:
    """Fault injection: the first registered block's layer-0 keys get +1 once it is registered."""

    def __init__(self):
        self.done = False

    def on_phase(self, e):
        pass

    def on_window_end(self, engine, trace, window):
        if self.done or trace.kind != "verify" or not engine.prefix.allocator.hash_of:
            return
        b = next(iter(engine.prefix.allocator.hash_of))
        engine.cache.key[0, b] += 1.0
        self.done = True


def test_a_registered_block_that_differs_from_target_only_is_named(pair):
    report = audit_conversations(LabConfig(), pair, conversations(pair, 2, 1, 20), 4, block_size=4,
                                 prefix_cache=PrefixCacheConfig(), observers=[WriteRegistered()])
    f = report.store("prefix_cache")
    assert f.status == "reached" and f.detail["why"] == "differs_from_target_only" and f.detail["layer"] == 0
    assert f.detail["max_abs_diff"] > report.run["tolerance"] >= report.run["noise_floor"]


@pytest.mark.parametrize("argv, says", [(["--head-cache", "missing"], "add --prefix-cache"),
                                        (["--prefix-cache", "--lookahead", "nope"], "choose from drop_last, boundary"),
                                        (["--preemption", "nope"], "choose from recompute, swap")])
def test_cli_refuses_bad_strategy_names(capsys, argv, says):
    assert main(["audit", *argv]) == 2
    assert says in capsys.readouterr().err
