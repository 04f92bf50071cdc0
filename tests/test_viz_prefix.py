"""Chapter 15's measurements (nwor_lab.viz.prefix, nwor_lab.viz.prefix_lifecycle) on the shipped pair, small:
the strategies' hit rates and acceptance come from the engine's counters, the block states read the
allocator, and a request dropped between verify and commit keeps no draft under any policy."""
import plotly.graph_objects as go
import pytest

from nwor_lab.model import load_tiny
from nwor_lab.viz.prefix import (FREE, IDLE, PROMPTS, SHARED, acceptance_figure, block_life, block_life_figure,
                                 conversations, hit_rate_figure, strategy_runs)
from nwor_lab.viz.prefix_lifecycle import drop_frames, drop_frames_figure

BS = 8


@pytest.fixture(scope="module")
def pair():
    target, head, tok = load_tiny()
    return target.eval(), head.eval(), tok


def test_conversations_refuses_more_returning_than_prompts():
    assert len(conversations(PROMPTS[:2], 1)) == 3
    with pytest.raises(ValueError, match="returning"):
        conversations(PROMPTS[:2], 3)


def test_strategies_side_by_side(pair):
    rows = strategy_runs(pair, conversations(PROMPTS[:2], 1), new_tokens=10, block_size=BS)
    by = {r["label"]: r for r in rows}
    only, exact, drop = by["target-only"], by["EAGLE: boundary + cached"], by["EAGLE: drop_last + cached"]
    assert all(r["tokens_exact"] for r in rows)
    assert exact["hit_tokens"] == only["hit_tokens"] > 0
    assert drop["hit_tokens"] == only["hit_tokens"] - BS * only["hit_requests"]
    assert drop["recomputed_tokens"] == only["hit_tokens"] - drop["hit_tokens"]
    assert exact["acceptance_after_hit"] == exact["acceptance_same_without_cache"]
    assert exact["hit_request_indices"] == [1, 2]
    assert isinstance(hit_rate_figure(rows), go.Figure) and isinstance(acceptance_figure(rows), go.Figure)


def test_block_life_a_hit_shares_blocks_that_were_idle(pair):
    texts = conversations(PROMPTS[:1], 1)
    life = block_life(pair, texts, new_tokens=6, block_size=BS, num_blocks=32)
    captions = [c for c, _, _ in life["frames"]]
    assert captions[0].startswith("A prefilled") and captions[-1].startswith("B finished") and len(captions) == 4
    (_, finished, _), (_, again, _) = life["frames"][1], life["frames"][2]
    shared = [b for b, s in enumerate(again) if s == SHARED]
    assert len(shared) == life["hits"][1] // BS > 0 and all(finished[b] == IDLE for b in shared)
    assert FREE in finished                      # A's partial block went back to the free list
    assert isinstance(block_life_figure(life), go.Figure)


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_abort_between_verify_and_commit_keeps_no_draft(pair, mode):
    run = drop_frames(pair, PROMPTS[:2], nwor_mode=mode, rid=1, step=2, new_tokens=8, block_size=BS)
    frames = {f["phase"]: f for f in run["frames"]}
    commit = frames["commit"]
    assert commit["accepted"] == 0 and commit["num_computed"] == frames["begin"]["num_computed"]
    written = frames["verify done: abort here"]["changed"]
    assert (written > 0) == (mode != "stage")
    assert (commit["changed"] == 0) == (mode in ("cow", "stage"))     # cow restored, stage never wrote
    assert frames["after the step"]["aborted"] and frames["after the step"]["blocks"] == 0
    assert run["others_unchanged"] and run["dropped_output_is_prefix"]
    assert isinstance(drop_frames_figure([run]), go.Figure)


def test_preempt_by_swap_comes_back_with_the_same_tokens(pair):
    run = drop_frames(pair, PROMPTS[:2], what="preempt", preemption="swap", rid=1, step=2, new_tokens=8,
                      block_size=BS)
    assert run["dropped_equals_reference"] and run["others_unchanged"]
    assert run["stats"]["swapped_out_bytes"] == run["stats"]["swapped_in_bytes"] > 0
    with pytest.raises(ValueError, match="what"):
        drop_frames(pair, PROMPTS[:2], what="evict")
