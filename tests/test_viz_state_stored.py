"""Chapter 13's readers of stored GPU results: `bench state` rows to a table, stage against snapshots
at a batch, the logit-gap check told honestly (pass, or fail identically), and `audit --json` lines
split into runs. Synthetic documents: no stored file is needed."""
import json

import plotly.graph_objects as go
import pytest

from nwor_lab.viz import state_stored as ss

EXACT = ["snapshots", "cow", "replay", "stage"]


def _row(strategy, batch, *, tps, steady, gap, tol, over=0, div=None):
    return {"strategy": strategy, "batch": batch, "correct": over == 0 and gap <= tol, "first_divergence": div,
            "first_divergence_prompt": None if div is None else 2, "max_logit_gap": gap, "tolerance": tol,
            "target_only_max_logit_gap": tol, "target_tokens_over_tolerance": over, "target_tokens_checked": 10,
            "tokens_per_s": tps, "step_ms": 1000 / tps, "state_bytes_steady": steady,
            "state_bytes_window": 2 * steady, "mean_acceptance_length": 3.0}


def _doc(exact_gap_64=0.31):
    rows = []
    for b, tol, gap in ((32, 0.29, 0.29), (64, 0.30, exact_gap_64)):
        rows.append(_row("off", b, tps=300, steady=1 << 20, gap=7.0, tol=tol, over=8, div=3))
        for n, tps in zip(EXACT, (100, 200, 250, 280)):
            over = int(gap > tol)
            rows.append(_row(n, b, tps=tps, steady=(5 << 20) if n == "snapshots" else 1 << 20, gap=gap, tol=tol,
                             over=over, div=36 if over else None))
    return {"k": 4, "batches": [32, 64], "results": rows}


def test_done_when_compares_stage_with_snapshots_at_the_batch():
    bar = ss.done_when(_doc(), batch=32)
    assert bar["no_slower"] and bar["speedup"] == pytest.approx(2.8)
    assert bar["memory_ratio"] == pytest.approx(0.2) and bar["memory_ok"]       # exactly 1/(k+1) meets the bound
    with pytest.raises(KeyError, match="batch=8"):
        ss.done_when(_doc(), batch=8)


def test_the_check_text_says_pass_or_an_identical_failure():
    doc = _doc()
    assert "they pass" in ss.check_text(doc, 32, EXACT)
    fail = ss.check_text(doc, 64, EXACT)
    assert "miss it on 1 of 10" in fail and "identically" in fail and "0.0100" in fail
    assert "**within noise**" in fail          # target-only's own gap moves 0.01 between the batches
    doc["results"][-1]["max_logit_gap"] = 0.5                # one strategy differs: no claim of shared arithmetic
    assert "differ" in ss.check_text(doc, 64, EXACT) and "identically" not in ss.check_text(doc, 64, EXACT)


def test_engine_rows_and_figures_render():
    doc = _doc()
    rows = ss.engine_rows(doc)
    assert len(rows) == 10 and rows[0]["verdict"] == "wrong" and rows[1]["first divergence"] == "none"
    table = ss.markdown_table(rows, ["batch", "strategy", "tok/s"]).splitlines()
    assert table[0] == "| batch | strategy | tok/s |" and len(table) == 12
    for fig in (ss.throughput_figure(doc, title="t"), ss.logit_gap_figure(doc, title="g")):
        assert isinstance(fig, go.Figure)
        fig.to_json()
    gap = ss.logit_gap_figure(doc, title="g")
    assert [a.text for a in gap.layout.annotations][:2] == ["batch 32 · tolerance (dashed) 0.2900",
                                                             "batch 64 · tolerance (dashed) 0.3000"]


def test_audit_lines_split_into_runs_and_a_cut_off_run_is_named():
    def store(name, status, window=None):
        return json.dumps({"store": name, "status": status, "first_window": window,
                           "window_kind": "verify" if window is not None else None})
    summary = {"summary": True, "model": "hybrid", "nwor_mode": "stage", "state_mode": "off", "ring_slots": None,
               "first_divergence": {"request": 0, "token": 4, "window": 3}}
    lines = [store("kv", "clean"), store("recurrent_state", "reached", 1), json.dumps(summary), "",
             store("kv", "reached", 2), json.dumps({**summary, "nwor_mode": "off", "state_mode": None,
                                                    "ring_slots": 8, "first_divergence": None})]
    runs = ss.audit_runs(lines)
    assert [sorted(r["stores"]) for r in runs] == [["kv", "recurrent_state"], ["kv"]]
    table = ss.audit_table(runs)
    assert table[0]["recurrent_state"] == "1 (verify)" and table[0]["ring"] == "—"
    assert table[0]["first divergence"] == "request 0, token 4 (window 3)"
    assert table[1]["K/V"] == "off + ring of 8" and table[1]["state"] == "—" and table[1]["kv"] == "2 (verify)"
    with pytest.raises(ValueError, match="cut off"):
        ss.audit_runs(lines + [store("kv", "clean")])


def test_the_calibration_text_names_a_prefill_token_and_the_batches_that_passed():
    doc = _doc(exact_gap_64=0.2)                             # batch 64: every exact strategy within
    for r in doc["results"]:
        if r["batch"] == 32 and r["strategy"] != "off":      # batch 32: flagged at the prefill's token
            r.update(correct=False, first_divergence=0, first_divergence_prompt=23, max_logit_gap=0.3)
    doc["batches"] = [32, 64, 1]                             # batch 1 never ran
    text = ss.calibration_text(doc, EXACT)
    assert "all four exact strategies were flagged at token 0 of prompt 23 — the token the prefill emits" in text
    assert "At batch 64 every exact strategy" in text and "stopped before batch 1" in text
    doc["results"][1]["correct"] = True                      # one strategy passed: no "all four"
    assert "three exact strategies were flagged" in ss.calibration_text(doc, EXACT)


def test_three_verdicts_exact_within_the_targets_own_noise_and_wrong():
    doc = _doc()                                  # target-only's own largest gap: 0.29 at 32, 0.30 at 64
    assert ss.noise_band(doc) == pytest.approx(0.01)
    verdicts = {(r["strategy"], r["batch"]): ss.verdict(doc, r) for r in doc["results"]}
    assert verdicts[("stage", 32)] == "exact" and verdicts[("off", 32)] == "wrong"
    assert verdicts[("stage", 64)] == "within noise"            # 0.31 against 0.30: the band's width, no more
    far = _doc(exact_gap_64=0.33)                               # 0.03 over: three times the target's own spread
    assert ss.verdict(far, ss.row(far, "stage", 64)) == "wrong"
    assert "**wrong**" in ss.check_text(far, 64, EXACT)
    one = {"k": 4, "results": [r for r in doc["results"] if r["batch"] == 64]}   # one batch: one bf16 step
    assert ss.noise_band(one) == pytest.approx(0.30 * ss.BF16_EPS)
    assert ss.verdict(one, ss.row(one, "stage", 64)) == "wrong"  # 0.01 is more than 0.0023
    colours = set(ss.logit_gap_figure(doc, title="g").data[1].marker.color)
    assert colours == {ss.VERDICT_COLOURS["wrong"], ss.VERDICT_COLOURS["within noise"]}     # batch 64's panel


def test_the_stored_batch_64_row_reads_within_noise_not_wrong():
    path = ss.results_dir() / "state8b_h200.json"
    doc = ss.load(path)
    got = {(r["strategy"], r["batch"]): ss.verdict(doc, r) for r in doc["results"]}
    assert {got[(n, 64)] for n in EXACT} == {"within noise"} and got[("off", 64)] == "wrong"
    assert {got[(n, 32)] for n in EXACT} == {"exact"}
