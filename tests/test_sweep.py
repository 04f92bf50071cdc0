"""Papermill sweeps end to end on `tests/data/sweep_probe.ipynb`, plus the pure parts (grid, run ids,
metrics contract, results log, figures) on their own.

The probe records `x_squared = x*x`, `step_ms = 10*x (+1 when mode == "b")`, `mode_upper`,
`sizes_sum` (of its list parameter `sizes`) and `interactive`, sleeps `sleep_s` and raises
`ValueError` when `mode == fail_on`. A papermill run costs ~2-4 s
here (kernel start), so only the first test sweeps 4 combinations (two parameters, two workers);
the rest stay small.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweep_tools import kernel_sees_this_checkout  # noqa: F401 - autouse: this checkout on PYTHONPATH
from nwor_lab.sweep import (METRICS_ENV, SweepInputError, expand_grid, latest_rows, parse_grid, parse_set,
                            parse_value, read_rows, record_metrics, run_id, write_report)
from nwor_lab.sweep.cli import add_parsers, main
from nwor_lab.sweep.environment import device_for_slot, visible_devices
from nwor_lab.sweep.figures import metric_figure, metric_label, numeric_metrics, varying_params
from nwor_lab.sweep.results import ResultsLog

REPO = Path(__file__).resolve().parents[1]
PROBE = str(REPO / "tests" / "data" / "sweep_probe.ipynb")
SWEEP = ["sweep", PROBE, "--no-progress"]


def expected_metrics(x: int, mode: str, sizes=(1, 2)) -> dict:
    """What the probe records; `interactive` is False: the sweep injects interactive=False."""
    return {"x_squared": x * x, "step_ms": 10.0 * x + (1.0 if mode == "b" else 0.0), "mode_upper": mode.upper(),
            "sizes_sum": sum(sizes), "interactive": False}


def lines_of(path: Path) -> list[dict]:
    """Every line of results.jsonl, each required to be a complete JSON object ending in a newline."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode().splitlines()]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose environment mentions `text` (workers and kernels carry the run's paths)."""
    found = []
    if not os.path.isdir("/proc"):  # not Linux: nothing to inspect
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def sweep4(tmp_path_factory):
    """4 combinations (x in 1, 2, mode in a, b) with 2 workers; shared by the read-only tests."""
    out = tmp_path_factory.mktemp("sweep4") / "probe"
    rc = main([*SWEEP, "--grid", "x=1,2", "--grid", "mode=a,b", "--out", str(out), "--workers", "2"])
    return rc, out


# ---------------------------------------------------------------- sweeps (papermill)

@pytest.mark.slow
def test_sweep_of_4_combinations_records_one_correct_row_per_run(sweep4):
    rc, out = sweep4
    assert rc == 0
    rows = lines_of(out / "results.jsonl")
    assert sorted(r["run_id"] for r in rows) == sorted(f"mode={m},x={x}" for x in range(1, 3) for m in "ab")
    for row in rows:
        x, mode = row["params"]["x"], row["params"]["mode"]
        assert row["params"] == {"x": x, "mode": mode}
        assert row["status"] == "ok" and row["error"] is None
        assert row["metrics"] == expected_metrics(x, mode)
        assert row["duration_s"] > 0 and row["started_at"]
        assert row["env"]["device"] == "cpu" and row["env"]["torch"]
        assert (out / row["notebook"]).is_file()
    assert not (out / ".work").exists()


@pytest.mark.slow
def test_two_workers_run_concurrently_and_give_the_rows_of_one_worker(sweep4, tmp_path):
    _, out = sweep4
    rows = lines_of(out / "results.jsonl")

    def interval(row):
        from datetime import datetime
        start = datetime.fromisoformat(row["started_at"]).timestamp()
        return start, start + row["duration_s"]

    spans = sorted(interval(r) for r in rows)
    assert any(b_start < a_end for (_, a_end), (b_start, _) in zip(spans, spans[1:])), "no two runs overlapped"
    serial = tmp_path / "serial"
    assert main([*SWEEP, "--grid", "x=2", "--grid", "mode=b", "--out", str(serial), "--workers", "1"]) == 0
    [row] = lines_of(serial / "results.jsonl")
    twin = latest_rows(out)[row["run_id"]]
    assert {k: row[k] for k in ("params", "metrics", "status", "error")} == \
           {k: twin[k] for k in ("params", "metrics", "status", "error")}


@pytest.mark.slow
def test_failing_run_is_recorded_named_and_rerun_retries_only_it(tmp_path, capsys):
    out = tmp_path / "fail"
    argv = [*SWEEP, "--grid", "mode=a,b,c", "--set", "fail_on=b", "--out", str(out), "--workers", "2"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "mode=b: ValueError: mode 'b' is fail_on" in err.splitlines()[-1]
    rows = {r["run_id"]: r for r in lines_of(out / "results.jsonl")}
    assert rows["mode=b"]["status"] == "failed" and rows["mode=b"]["error"] == "ValueError: mode 'b' is fail_on"
    assert rows["mode=b"]["metrics"] == {}
    for ok in ("mode=a", "mode=c"):
        assert rows[ok]["status"] == "ok" and rows[ok]["metrics"] == expected_metrics(1, ok[-1])
    mtimes = {rid: (out / rows[rid]["notebook"]).stat().st_mtime_ns for rid in rows}

    assert main(argv) == 1  # the failure is deterministic: retried, fails again
    err = capsys.readouterr().err
    assert "skipping 2 of 3 runs already ok" in err
    rows2 = lines_of(out / "results.jsonl")
    assert [r["run_id"] for r in rows2[3:]] == ["mode=b"]  # one new row: the retry
    for rid in ("mode=a", "mode=c"):  # not executed again
        assert (out / rows[rid]["notebook"]).stat().st_mtime_ns == mtimes[rid]
    assert (out / rows["mode=b"]["notebook"]).stat().st_mtime_ns > mtimes["mode=b"]

    page = write_report(out)
    text = page.read_text()
    assert text.count("data-run-id=") == 3 and "ValueError: mode &#x27;b&#x27; is fail_on" in text


@pytest.mark.slow
def test_sigint_keeps_finished_rows_exits_130_and_resume_completes(tmp_path, capsys):
    out = tmp_path / "interrupted"
    args = [*SWEEP, "--grid", "x=1,2,3", "--set", "sleep_s=0.5", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "nwor_lab.sweep", *args], stderr=subprocess.PIPE, text=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 90
    while not (results.exists() and results.stat().st_size) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted:" in err and "Resume (finished runs are skipped): python -m nwor_lab.sweep sweep" in err
    before = lines_of(results)  # only complete lines
    assert 1 <= len(before) < 3 and all(r["status"] == "ok" for r in before)
    assert not processes_mentioning(str(out)), "a worker or kernel outlived the sweep"

    assert main([*args, "--workers", "2"]) == 0
    assert f"skipping {len(before)} of 3 runs already ok" in capsys.readouterr().err
    after = lines_of(results)
    assert after[: len(before)] == before  # nothing finished was lost or rewritten
    assert sorted(r["run_id"] for r in after) == ["x=1", "x=2", "x=3"]  # each run recorded exactly once


@pytest.mark.slow
def test_timeout_kills_the_run_and_its_kernel(tmp_path):
    out = tmp_path / "timeout"
    assert main([*SWEEP, "--grid", "x=1", "--set", "sleep_s=60", "--timeout", "5", "--out", str(out)]) == 1
    [row] = lines_of(out / "results.jsonl")
    assert row["status"] == "failed" and row["error"].startswith("TimeoutError: run exceeded --timeout 5 s")
    assert not processes_mentioning(str(out))


@pytest.mark.slow
def test_report_is_one_self_contained_page_with_a_row_per_run(sweep4, capsys):
    from plotly.offline import get_plotlyjs

    _, out = sweep4
    assert main(["report", str(out)]) == 0
    page = out / "report.html"
    assert capsys.readouterr().out.strip() == f"wrote {page}"
    text = page.read_text(encoding="utf-8")
    library = get_plotlyjs()
    assert library in text  # the library itself, inline
    page_proper = text.replace(library, "")
    assert "<script src=" not in page_proper and "http" not in page_proper.split("<body>")[0]  # nothing fetched
    run_ids = [r["run_id"] for r in read_rows(out)]
    assert text.count("data-run-id=") == len(run_ids) == 4
    for rid in run_ids:
        assert f'data-run-id="{rid}"' in text
    assert "step (ms)" in text and "x squared" in text  # one figure per numeric metric, unit in the title


@pytest.mark.parametrize("args, names", [
    (["--grid", "x1,2"], "--grid 'x1,2'"),
    (["--grid", "x="], "--grid 'x='"),
    (["--grid", "nope=1,2"], "--grid nope"),
    (["--grid", "x=1,2", "--set", "x=3"], "--set x"),
    (["--grid", "x=1", "--workers", "0"], "argument --workers: must be >= 1, got 0"),
    (["--grid", "x=1", "--kernel", "no-such-kernel"], "--kernel"),
])
def test_bad_input_exits_2_with_one_line(args, names, tmp_path, capsys):
    assert main([*SWEEP, *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and names in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_missing_notebook_and_file_as_out_exit_2(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "none.ipynb"), "--grid", "x=1", "--out", str(tmp_path / "o")]) == 2
    assert "NOTEBOOK" in capsys.readouterr().err
    (tmp_path / "f").write_text("")
    assert main([*SWEEP, "--grid", "x=1", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_changed_set_values_are_refused_not_mixed(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    with ResultsLog(out) as log:
        log.append({"run_id": "x=1", "params": {"x": 1, "mode": "a"}, "status": "ok", "metrics": {}})
    assert main([*SWEEP, "--grid", "x=1", "--set", "mode=b", "--out", str(out)]) == 2
    assert "run x=1 there has parameters" in capsys.readouterr().err


def test_a_second_sweep_into_a_busy_folder_is_refused(tmp_path, capsys):
    from nwor_lab.sweep.guards import FolderLock

    out = tmp_path / "busy"
    out.mkdir()
    with FolderLock(out):
        assert main([*SWEEP, "--grid", "x=1", "--out", str(out)]) == 2
    assert "another sweep is writing there" in capsys.readouterr().err
    assert not (out / "results.jsonl").exists()


# ---------------------------------------------------------------- pure parts

def test_values_are_typed_like_python_literals():
    assert [parse_value(t) for t in ["8", "-3", "0.5", "1e-3", "true", "False", "none", "'8'", "off", ""]] == \
           [8, -3, 0.5, 1e-3, True, False, None, "8", "off", ""]
    assert parse_grid(["batch=1,8", "mode=off, stage"]) == {"batch": [1, 8], "mode": ["off", "stage"]}
    with pytest.raises(SweepInputError, match="given twice"):
        parse_grid(["x=1", "x=2"])
    assert parse_set(["max_new_tokens=64", "tag=''"], {}) == {"max_new_tokens": 64, "tag": ""}


def test_grid_expands_in_flag_order_and_run_ids_are_stable_and_safe():
    runs = expand_grid({"b": [1, 8], "mode": ["off", "stage"]}, {"k": 4})
    assert runs[:2] == [{"b": 1, "mode": "off", "k": 4}, {"b": 1, "mode": "stage", "k": 4}]
    assert run_id({"mode": "off", "b": 8, "k": 4}, ["mode", "b"]) == "b=8,mode=off"  # sorted; fixed left out
    assert run_id({"b": 8, "mode": "off"}) == run_id({"mode": "off", "b": 8})
    slash, dash = run_id({"p": "a/b"}), run_id({"p": "a-b"})
    assert "/" not in slash and slash != dash  # sanitised, still distinct
    assert len(run_id({"p": "v" * 500})) <= 120
    assert run_id({}) == "defaults"


def test_record_metrics_contract(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    assert record_metrics({"a_ms": 1.5, "n": torch.tensor(3), "nan": float("nan"), "s": "x"}) == \
           {"a_ms": 1.5, "n": 3, "nan": None, "s": "x"}  # interactive: returned, nothing written
    path = tmp_path / "m.json"
    monkeypatch.setenv(METRICS_ENV, str(path))
    record_metrics({"a": 1, "b": 2})
    record_metrics({"b": 3})  # merges; a later value wins
    assert json.loads(path.read_text()) == {"a": 1, "b": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # no temporary file left
    with pytest.raises(TypeError, match="'nested'"):
        record_metrics({"nested": {"a": 1}})
    with pytest.raises(TypeError, match="'vec'"):
        record_metrics({"vec": torch.ones(2)})


def test_results_log_drops_a_torn_tail_before_appending(tmp_path):
    (tmp_path / "results.jsonl").write_text('{"run_id": "a", "params": {}, "status": "ok"}\n{"run_id": "b", "sta')
    with ResultsLog(tmp_path) as log:
        log.append({"run_id": "c", "params": {}, "status": "ok"})
    assert [r["run_id"] for r in lines_of(tmp_path / "results.jsonl")] == ["a", "c"]


def test_each_worker_sees_one_gpu_when_several_exist():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_devices({}, count=2) == ["0", "1"]
    assert [device_for_slot(s, ["2", "3"]) for s in range(3)] == ["2", "3", "2"]
    assert device_for_slot(0, ["0"]) is None and device_for_slot(1, []) is None


def test_figure_layout_follows_the_varying_parameters():
    rows = [{"run_id": f"{x}{m}{k}", "params": {"x": x, "mode": m, "k": k, "seed": 0}, "status": "ok",
             "metrics": {"step_ms": float(x), "label": "t"}} for x in (1, 2, 4) for m in ("off", "stage") for k in (2, 4)]
    rows.append({"run_id": "bad", "params": {"x": 8, "mode": "off", "k": 2, "seed": 0}, "status": "failed", "metrics": {}})
    assert varying_params(rows) == ["x", "mode", "k"] and numeric_metrics(rows) == ["step_ms"]
    fig = metric_figure(rows, "step_ms", ["x", "mode", "k"])
    assert len(fig.data) == 4 and {t.type for t in fig.data} == {"scatter"}  # 2 modes x 2 panels (k), lines over x
    assert [a.text for a in fig.layout.annotations] == ["k=2", "k=4"]
    assert [t.name for t in fig.data if t.showlegend] == ["off", "stage"]  # one legend entry per mode
    assert fig.layout.title.text == "step (ms)" and fig.layout.yaxis.title.text == "step (ms)"
    bars = metric_figure(rows[:4], "step_ms", ["x", "mode"])  # x in {1, 2}: too few points for a line
    assert {t.type for t in bars.data} == {"bar"}
    assert metric_label("decode_tok_s") == ("decode", "tokens/s") and metric_label("acceptance_length") == ("acceptance length", None)


def test_add_parsers_wires_both_subcommands():
    import argparse
    parser = argparse.ArgumentParser(prog="nwor-lab")
    add_parsers(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["report", "runs/x"])
    assert args.func.__name__ == "cmd_report" and args.out is None
    args = parser.parse_args(["sweep", "nb.ipynb", "--grid", "x=1,2", "--out", "runs/x"])
    assert args.func.__name__ == "cmd_sweep" and args.grid == ["x=1,2"] and args.prog_name == "nwor-lab sweep"


def test_importing_the_package_pulls_in_neither_torch_nor_papermill_nor_plotly():
    code = "import sys, nwor_lab.sweep; print(sorted({'torch', 'papermill', 'plotly'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- timings with their noise
def timed_rows(tok: dict[str, tuple[float, float, float]], reference: dict[str, tuple[float, float, float]] | None = None):
    """Rows of a policy sweep at k=2: `tok[mode]` = (median, min, max) tokens/s; bytes that the policy decides."""
    from nwor_lab.sweep.spread import REFERENCE
    rows = []
    for i, (mode, (med, lo, hi)) in enumerate(tok.items()):
        metrics = {"bytes_written": 1000 * (i + 1), "mean_acceptance_length": 2.5,
                   "tok_s": med, "tok_s_min": lo, "tok_s_max": hi}
        if reference:
            r_med, r_lo, r_hi = reference[mode]
            metrics.update({"target_only_tok_s": r_med, "target_only_tok_s_min": r_lo, "target_only_tok_s_max": r_hi,
                            REFERENCE: "target_only_tok_s"})
        rows.append({"run_id": f"k=2,nwor_mode={mode}", "params": {"nwor_mode": mode, "k": 2}, "status": "ok",
                     "metrics": metrics})
    return rows


def test_spread_records_the_median_and_the_range_of_repeats():
    from nwor_lab.sweep.spread import spread
    assert spread("tok_s", [30.0, 10.0, 20.0, 40.0]) == {"tok_s": 25.0, "tok_s_min": 10.0, "tok_s_max": 40.0}
    assert record_metrics(spread("step_ms", [2, 1, 3])) == {"step_ms": 2.0, "step_ms_min": 1.0, "step_ms_max": 3.0}
    with pytest.raises(ValueError, match="'tok_s'"):
        spread("tok_s", [])


def test_a_timing_is_drawn_after_what_the_runs_changed_as_median_and_range():
    from nwor_lab.sweep.figures import plotted_metrics, sweep_figures
    rows = timed_rows({"off": (100.0, 90.0, 110.0), "cow": (104.0, 95.0, 112.0), "stage": (98.0, 91.0, 103.0)})
    assert plotted_metrics(rows) == (["bytes_written"], ["tok_s"])       # tok_s_min / _max fold into tok_s
    figures = dict(sweep_figures(rows))
    assert list(figures) == ["bytes_written", "tok_s"]
    tok = figures["tok_s"]
    assert {t.type for t in tok.data} == {"scatter"} and all(t.mode == "markers" for t in tok.data)   # no bar from 0
    (trace,) = tok.data
    assert list(trace.y) == [100.0, 104.0, 98.0]
    assert list(trace.error_y.array) == [10.0, 8.0, 5.0] and list(trace.error_y.arrayminus) == [10.0, 9.0, 7.0]
    assert {t.type for t in figures["bytes_written"].data} == {"bar"}


def test_verdicts_say_when_differences_lie_within_the_noise():
    from nwor_lab.sweep.spread import reference_of, verdicts
    params = ["nwor_mode", "k"]
    overlap = timed_rows({"off": (100.0, 90.0, 110.0), "cow": (104.0, 95.0, 112.0), "stage": (98.0, 91.0, 103.0)})
    (v,) = verdicts(overlap, "tok_s", params, "tokens/s", has_range=True)
    assert v.within and "overlaps every other's" in v.text and "read no ranking" in v.text
    apart = timed_rows({"off": (60.0, 55.0, 70.0), "cow": (33.0, 32.0, 36.0), "stage": (28.0, 24.0, 29.0)})
    (v,) = verdicts(apart, "tok_s", params, "tokens/s", has_range=True)
    assert not v.within and "no two runs' ranges overlap" in v.text and "repeat the sweep" in v.text
    # the same work timed in every run moved 2.2x between the runs: a 2.1x difference is that noise
    drifted = timed_rows({"off": (60.0, 55.0, 70.0), "cow": (33.0, 32.0, 36.0), "stage": (28.0, 24.0, 29.0)},
                         reference={"off": (42.0, 38.0, 46.0), "cow": (25.0, 23.0, 29.0), "stage": (19.0, 18.5, 19.1)})
    assert reference_of(drifted) == "target_only_tok_s"
    (v,) = verdicts(drifted, "tok_s", params, "tokens/s", has_range=True, reference="target_only_tok_s")
    assert v.within and "moved 2.21x between these runs" in v.text
    (v,) = verdicts(drifted, "target_only_tok_s", params, "tokens/s", has_range=True, reference="target_only_tok_s")
    assert v.within and "same work in every run" in v.text
    steady = timed_rows({"off": (60.0, 55.0, 70.0), "cow": (33.0, 32.0, 36.0), "stage": (28.0, 24.0, 29.0)},
                        reference={m: (40.0, 39.0, 41.0) for m in ("off", "cow", "stage")})
    (v,) = verdicts(steady, "tok_s", params, "tokens/s", has_range=True, reference="target_only_tok_s")
    assert not v.within and "moved 1.00x between these runs" in v.text     # the machine held still: beyond noise
    once = [{**r, "metrics": {"tok_s": r["metrics"]["tok_s"]}} for r in apart]
    (v,) = verdicts(once, "tok_s", params, "tokens/s", has_range=False)
    assert v.within and "measured once per run" in v.text and "rank nothing" in v.text


def test_the_report_shows_changes_before_timings_and_says_what_the_noise_allows(tmp_path):
    from nwor_lab.sweep.report import table_columns
    rows = timed_rows({"off": (60.0, 55.0, 70.0), "cow": (33.0, 32.0, 36.0), "stage": (28.0, 24.0, 29.0)},
                      reference={"off": (42.0, 38.0, 46.0), "cow": (25.0, 23.0, 29.0), "stage": (19.0, 18.5, 19.1)})
    _, metrics = table_columns(rows)
    assert [h for _, h in metrics] == ["bytes_written", "mean_acceptance_length", "tok_s (median, min–max)",
                                       "target_only_tok_s (median, min–max)"]
    with ResultsLog(tmp_path) as log:
        for r in rows:
            log.append(r)
    page = write_report(tmp_path).read_text()
    assert page.index("What the runs changed") < page.index("Timings, with their noise")
    assert ">60 (55–70)<" in page                                        # median (min–max) in the table
    assert page.count('<p class="noise">') == 2 and "apart" not in page.split("Timings, with their noise")[1].split("<script")[0]
    assert "the same work in every run" in page and "no ranking" in page
