"""off / cow / stage inside vLLM's engine, EAGLE-1, EAGLE-3 and ngram: tokens, acceptance, cache bytes.

Every window runs with `check=True` (the runtime compares vLLM's cache with the invariants after
each window: rejected slots bit-identical under cow and stage, kept slots holding exactly the K/V
written) and `debug=True` (SCV's count equals vLLM's sampler output every step)."""
import pytest

from conftest import MODES, PROMPTS, lab_generate

MAX_NEW = 32


@pytest.fixture(scope="module", params=["eagle", "eagle3", "ngram"])
def runs(request):
    from nwor_lab.vllm.generate import VllmLab
    lab = VllmLab(request.param, 4, check=True, debug=True)
    out = {mode: lab.generate(PROMPTS, MAX_NEW, nwor_mode=mode) for mode in MODES}
    yield request.param, out
    lab.close()


def test_greedy_tokens_identical_in_every_policy(runs):
    method, out = runs
    assert out["off"].token_ids == out["cow"].token_ids == out["stage"].token_ids
    assert all(len(t) == MAX_NEW for t in out["off"].token_ids)


def test_every_window_was_checked_and_counted(runs):
    method, out = runs
    for mode, res in out.items():
        windows = len(res.trace)
        assert windows > 0 and res.totals["checks_passed"] == windows, (mode, res.totals)
        assert res.totals["drafts"] > 0, f"{method}: no drafts were verified"
        # committed == vLLM's own count, summed (debug mode asserted it step by step)
        assert res.totals["accepted"] == res.vllm_metrics["vllm:spec_decode_num_accepted_tokens"]
        assert res.totals["drafts"] == res.vllm_metrics["vllm:spec_decode_num_draft_tokens"]


def test_rejected_writes_reach_vllms_cache_only_under_off(runs):
    method, out = runs
    off, cow, stage = (out[m].totals for m in MODES)
    assert off["rejected_writes"] > 0 and off["rejected_left"] == off["rejected_writes"]
    assert cow["rejected_writes"] == off["rejected_writes"] and cow["rejected_left"] == 0
    assert stage["rejected_writes"] == 0 and stage["rejected_left"] == 0
    assert stage["bytes_written"] < off["bytes_written"]


def test_statistics_equal_the_lab_engine(runs, shipped):
    """Same tokens as the lab's engine (and as target-only greedy); for the EAGLE heads the same
    per-position acceptance, so vLLM loads the shipped heads completely (EAGLE-1's fc.bias too)."""
    method, out = runs
    res = out["stage"]
    target_only = lab_generate(shipped, None, PROMPTS, MAX_NEW, k=0)
    assert res.token_ids == target_only.token_ids
    if method == "ngram":
        return
    lab = lab_generate(shipped, method, PROMPTS, MAX_NEW)
    assert res.token_ids == lab.token_ids
    assert res.acceptance_by_position == pytest.approx(lab.acceptance_by_position)
    assert res.mean_acceptance_length == pytest.approx(lab.mean_acceptance_length)
    assert res.target_forwards == lab.target_forwards
