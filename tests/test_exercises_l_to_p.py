"""Exercises (l)-(p), one per chapter that had none (00, 01, 09, 10, 11): planted wrong solutions are
caught with a counterexample in words and a picture, and the references agree with the package where it
computes the same thing. (That they pass, say "not attempted yet" for a stub and answer their prediction
is checked for every exercise in tests/test_exercises.py.)"""
import math
import statistics

import pytest
import torch

from exercise_tools import failed
from nwor_lab import exercises
from nwor_lab.exercises import solutions


def test_predictions_l_to_p():
    answers = {n: exercises.predict(n).answer for n in
               ("rejected_slots", "write_share", "napkin_speedup", "vllm_key_offsets", "sweep_medians")}
    assert answers == {"rejected_slots": [10, 11], "write_share": 0.4, "napkin_speedup": 2.41,
                       "vllm_key_offsets": [18, 22], "sweep_medians": 300.0}
    assert {exercises.exercise(n).chapter for n in answers} == {"00_tour", "01_why", "11_performance", "09_vllm",
                                                                "10_sweep"}


# -- (l) rejected_slots ------------------------------------------------------------------------------
def rejected_from_a(slots, token_req, token_draft_pos, accepted_len):
    """d_a counted as rejected (>= instead of >)."""
    keep = (token_draft_pos >= accepted_len[token_req]) & (token_draft_pos > 0) & (slots >= 0)
    return slots[keep]


def rejected_with_padding(slots, token_req, token_draft_pos, accepted_len):
    return slots[token_draft_pos > accepted_len[token_req]]


def rejected_int32(**kw):
    return solutions.rejected_slots(**kw).int()


def test_rejected_slots_catches_the_accepted_draft_padding_and_int32():
    r = failed(exercises.check_rejected_slots(rejected_from_a), "rejected_slots", "every draft accepted")
    assert "not rejected but listed" in r.message
    assert r.figure.layout.shapes, "the cells that differ are outlined"
    r = failed(exercises.check_rejected_slots(rejected_with_padding), "rejected_slots", "padding slot")
    assert "not rejected but listed [-1]" in r.message
    failed(exercises.check_rejected_slots(rejected_int32), "rejected_slots", "no drafts")


def test_rejected_slots_picture_outlines_only_the_tokens_that_differ():
    r = exercises.check_rejected_slots(rejected_from_a)
    (case, expected) = (r.case, r.expected)
    wrong = set(rejected_from_a(**case.inputs).tolist()) ^ set(expected.tolist())
    assert len(r.figure.layout.shapes) == len(wrong)


def test_rejected_slots_agree_with_the_off_policys_cache():
    """Under `off` the slots the reference lists are exactly the rejected drafts' slots of the window."""
    from nwor_lab.exercises import rejected_slots as module
    from nwor_lab.window import Window
    for case in module.cases(3, 60):
        i = case.inputs
        sched = torch.bincount(i["token_req"], minlength=len(i["accepted_len"])).tolist()
        drafts = [int((i["token_draft_pos"][i["token_req"] == r] > 0).sum()) for r in range(len(sched))]
        w = Window.from_counts(sched, drafts, i["slots"])
        commit = w.token_draft_pos <= i["accepted_len"][w.token_req]
        rejected = w.slot_mapping[~commit & (w.slot_mapping >= 0)]
        assert torch.equal(solutions.rejected_slots(**i), rejected), case.note


# -- (m) write_share ---------------------------------------------------------------------------------
def share_drafts_only(scheduled, drafted, accepted):
    """The fork's way: accepted drafts over drafts."""
    d = int(drafted.sum())
    return float(accepted.sum()) / d if d else 1.0


def share_without_prefills(scheduled, drafted, accepted):
    spec = drafted > 0
    off = int((1 + drafted[spec]).sum())
    return float((1 + accepted[spec]).sum()) / off if off else 1.0


def share_tensor(**kw):
    return torch.tensor(solutions.write_share(**kw))


def test_write_share_catches_counting_drafts_only_forgetting_prefills_and_a_tensor():
    r = failed(exercises.check_write_share(share_drafts_only), "write_share", "no draft accepted")
    assert "share: expected 0.2, got 0" in r.message
    failed(exercises.check_write_share(share_without_prefills), "write_share", "a prefill rides")
    failed(exercises.check_write_share(share_tensor), "write_share", "empty trace", "expected a Python float")


def test_write_share_reference_agrees_with_the_claims_formula():
    from nwor_lab.why import claims
    for a in (0, 1, 2.5, 4):
        rows = torch.tensor([5, 5]), torch.tensor([4, 4]), torch.tensor([math.floor(a), math.ceil(a)])
        assert solutions.write_share(*rows) == pytest.approx(claims.write_fraction(float(sum(rows[2])) / 2, 4))


# -- (n) napkin_speedup ------------------------------------------------------------------------------
def napkin_no_bonus(decode_ms, verify_ms, head_pass_ms, k, profile):
    length = float(profile.sum())
    return length, length * decode_ms / (verify_ms + k * head_pass_ms)


def napkin_chain_only(decode_ms, verify_ms, head_pass_ms, k, profile):
    """k - 1 head passes: forgets the head's pass over the verify window."""
    length = 1.0 + float(profile.sum())
    return length, length * decode_ms / (verify_ms + (k - 1) * head_pass_ms)


def napkin_conditional(decode_ms, verify_ms, head_pass_ms, k, profile):
    """Reads the profile as per-position conditional rates and multiplies them again."""
    length = 1.0 + float(torch.cumprod(profile, 0).sum())
    return length, length * decode_ms / (verify_ms + k * head_pass_ms)


def test_napkin_speedup_catches_the_bonus_token_the_heads_pass_and_a_product_too_many():
    r = failed(exercises.check_napkin_speedup(napkin_no_bonus), "napkin_speedup", "nothing accepted")
    assert "L: expected 1, got 0" in r.message
    failed(exercises.check_napkin_speedup(napkin_chain_only), "napkin_speedup", "nothing accepted")
    failed(exercises.check_napkin_speedup(napkin_conditional), "napkin_speedup", "the H100 anchor")


def test_napkin_speedup_reference_agrees_with_the_benchmark():
    from nwor_lab.bench import engine8b
    from nwor_lab.speculative.synthetic import ForcedAcceptance, mean_acceptance_length
    profile = torch.tensor(ForcedAcceptance().for_k(4), dtype=torch.float64)
    a = engine8b.H100_ANCHOR
    for head in ("eagle1", "eagle3"):
        length, speedup = solutions.napkin_speedup(a["decode_ms"], a["verify_k4_ms"], a[f"{head}_pass_ms"], 4, profile)
        assert length == pytest.approx(mean_acceptance_length(profile.tolist()))
        assert speedup == pytest.approx(engine8b.napkin(a, head, 4, length)["napkin_speedup"], abs=1e-3)


# -- (o) vllm_key_offsets ----------------------------------------------------------------------------
def keys_untransposed(slots, head, block_size, num_kv_heads, head_size):
    out = solutions.vllm_key_offsets(slots, head, block_size, num_kv_heads, head_size)
    ok = slots >= 0
    block, offset = slots // block_size, slots % block_size
    base = (block * num_kv_heads + head) * block_size * 2 * head_size
    out[ok] = (base + offset * head_size)[ok, None] + torch.arange(head_size)
    return out


def keys_without_values(slots, head, block_size, num_kv_heads, head_size):
    """Runs of block_size * head_size elements: forgets that the values share each run."""
    out = solutions.vllm_key_offsets(slots, head, block_size, num_kv_heads, head_size)
    ok = slots >= 0
    block, offset = slots // block_size, slots % block_size
    base = (block * num_kv_heads + head) * block_size * head_size
    out[ok] = (base + offset)[ok, None] + torch.arange(head_size) * block_size
    return out


def keys_padding_zero(**kw):
    return solutions.vllm_key_offsets(**kw).clamp(min=0)


def test_vllm_key_offsets_catches_untransposed_keys_forgotten_values_and_padding():
    r = failed(exercises.check_vllm_key_offsets(keys_untransposed), "vllm_key_offsets", "slot 0, head 0")
    assert "expected [0, 4], got [0, 1]" in r.message
    assert r.figure.layout.shapes, "your cells outside the key are outlined"
    failed(exercises.check_vllm_key_offsets(keys_without_values), "vllm_key_offsets", "the last offset of a block")
    failed(exercises.check_vllm_key_offsets(keys_padding_zero), "vllm_key_offsets", "padding")


def test_vllm_key_offsets_agree_with_the_labs_view_of_vllms_cache():
    from nwor_lab.exercises import vllm_key_offsets as module
    from nwor_lab.kv.layout import vllm_cpu_views
    for case in module.cases(2, 60):
        i = case.inputs
        nb = int(i["slots"].max().clamp(min=0)) // i["block_size"] + 1
        packed = torch.arange(nb * i["num_kv_heads"] * i["block_size"] * 2 * i["head_size"], dtype=torch.float64)
        key, _ = vllm_cpu_views(packed.view(nb, i["num_kv_heads"], i["block_size"], 2 * i["head_size"]))
        got = solutions.vllm_key_offsets(**i)
        for r, s in enumerate(i["slots"].tolist()):
            if s >= 0:
                want = key[s // i["block_size"], s % i["block_size"], i["head"]].long()
                assert torch.equal(got[r], want), case.note


# -- (p) sweep_medians -------------------------------------------------------------------------------
def cells(rows, metric, policies, ks):
    """(i, j, values) of every cell (policies[i], ks[j]) some finished run recorded `metric` for."""
    for i, p in enumerate(policies):
        for j, k in enumerate(ks):
            v = [r["metrics"][metric] for r in rows if r["status"] == "ok" and r["params"]["nwor_mode"] == p
                 and r["params"]["k"] == k and r["metrics"].get(metric) is not None]
            if v:
                yield i, j, v


def medians_by_mean(rows, metric, policies, ks):
    out = solutions.sweep_medians(rows, metric, policies, ks)
    for i, j, v in cells(rows, metric, policies, ks):
        out[i, j] = statistics.fmean(v)
    return out


def medians_with_failed(rows, metric, policies, ks):
    return solutions.sweep_medians([{**r, "status": "ok"} for r in rows], metric, policies, ks)


def medians_zero_for_missing(**kw):
    return solutions.sweep_medians(**kw).nan_to_num(0.0)


def test_sweep_medians_catches_the_mean_failed_runs_and_zero_for_missing():
    r = failed(exercises.check_sweep_medians(medians_by_mean), "sweep_medians", "four repeats")
    assert "first difference at cow, k 4" in r.message
    failed(exercises.check_sweep_medians(medians_with_failed), "sweep_medians", "a failed run")
    failed(exercises.check_sweep_medians(medians_zero_for_missing), "sweep_medians", "no rows")


def medians_numpy(rows, metric, policies, ks, dtype="float64"):
    """A correct answer written with numpy: np.median over each cell's values, NaN where none."""
    import numpy as np
    out = np.full((len(policies), len(ks)), np.nan, dtype=dtype)
    for i, j, v in cells(rows, metric, policies, ks):
        out[i, j] = np.median(v)
    return out


def test_sweep_medians_accepts_a_correct_numpy_answer_and_still_names_a_wrong_dtype():
    assert exercises.check_sweep_medians(medians_numpy, show=False).passed
    assert exercises.check_sweep_medians(lambda **kw: medians_numpy(**kw).tolist(), show=False).passed
    failed(exercises.check_sweep_medians(lambda **kw: medians_numpy(**kw, dtype="float32")), "sweep_medians", "",
           "dtype float32")


def test_sweep_medians_reads_rows_as_the_results_log_stores_them(tmp_path):
    """The rows the exercise reads are the ones `nwor_lab.sweep.results` writes and reads back."""
    from nwor_lab.exercises.sweep_medians import row
    from nwor_lab.sweep.results import ResultsLog, read_rows
    written = [row("off", 2, 300.0, n=0), row("off", 2, 310.0, n=1), row("stage", 2, 280.0, "failed", n=2)]
    with ResultsLog(tmp_path) as log:
        for r in written:
            log.append({**r, "duration_s": 1.0, "started_at": "2026-01-01T00:00:00+00:00", "notebook": "x.ipynb",
                        "env": {}})
    got = solutions.sweep_medians(read_rows(tmp_path), "tok_s", ["off", "stage"], [2])
    assert got[0, 0] == 305.0 and torch.isnan(got[1, 0])
