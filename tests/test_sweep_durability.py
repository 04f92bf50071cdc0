"""Sweeps as durable as a database log, and unable to mix experiments (issue 20; issue 19 item 6).

On `tests/data/sweep_probe.ipynb` (see tests/test_sweep.py for what it records). One sweep of three
runs is made once and copied for each scenario; each scenario then damages the folder the way a
crash or a hand edit would, resumes, and checks what survived. Processes are found by a marker
in their environment (`fault_tools.MARK`), which every worker and kernel inherits.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fault_tools import MARK, jsonl_rows, kill_marked, marked, new_mark, wait_gone
from sweep_tools import kernel_sees_this_checkout  # noqa: F401 - autouse: this checkout on PYTHONPATH
from nwor_lab import lifeline
from nwor_lab.sweep import read_rows, write_report
from nwor_lab.sweep.cli import main
from nwor_lab.sweep.results import ResultsLog

pytestmark = pytest.mark.slow       # papermill sweeps, resumed after each damage
REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "data" / "sweep_probe.ipynb"
SWEEP = ["sweep", str(PROBE), "--no-progress"]
LINUX = sys.platform.startswith("linux")


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("three") / "probe"
    assert main([*SWEEP, "--grid", "x=1,2,3", "--out", str(out), "--workers", "2"]) == 0
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "probe"
    shutil.copytree(folder, out)
    (out / ".lock").unlink(missing_ok=True)
    return out


def row(run_id: str, **kw) -> dict:
    return {"run_id": run_id, "params": {"x": int(run_id[2:])}, "status": "ok", "metrics": {}, **kw}


# -- the row a crash left without its newline ---------------------------------------------------------
def test_a_complete_last_row_without_its_newline_is_kept_and_not_rerun(three_runs, tmp_path, capsys):
    out = copy_of(three_runs, tmp_path)
    results = out / "results.jsonl"
    before = jsonl_rows(results)
    results.write_bytes(results.read_bytes().rstrip(b"\n"))          # a crash between the row and its \n
    assert [r["run_id"] for r in read_rows(out)] == [r["run_id"] for r in before]   # the reader keeps it
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "notebooks").iterdir()}
    assert main([*SWEEP, "--grid", "x=1,2,3", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipping 3 of 3 runs already ok" in err
    assert jsonl_rows(results) == before                               # newline restored, nothing dropped
    assert {p.name: p.stat().st_mtime_ns for p in (out / "notebooks").iterdir()} == mtimes
    assert write_report(out).read_text().count("data-run-id=") == 3


def test_a_torn_row_is_redone_never_counted_done(three_runs, tmp_path, capsys):
    out = copy_of(three_runs, tmp_path)
    results = out / "results.jsonl"
    before = jsonl_rows(results)
    data = results.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    results.write_bytes(data[: last + (len(data) - last) // 2])       # a crash in the middle of the last row
    torn = before[-1]["run_id"]
    assert torn not in {r["run_id"] for r in read_rows(out)}
    assert main([*SWEEP, "--grid", "x=1,2,3", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "the last row was torn" in err and "skipping 2 of 3 runs already ok" in err
    kept = list(out.glob("results.jsonl.damaged-*"))                 # the torn file, kept whole
    assert len(kept) == 1 and kept[0].read_bytes() == data[: last + (len(data) - last) // 2]
    after = jsonl_rows(results)
    assert after[:2] == before[:2] and [r["run_id"] for r in after[2:]] == [torn]
    assert after[2]["metrics"] == before[2]["metrics"] and after[2]["status"] == "ok"


# -- lines that are not rows: every damage class named `file:line: what is wrong` ----------------------
GOOD = {"run_id": "x=1", "params": {"x": 1}, "status": "ok", "metrics": {"x_squared": 1}}
DAMAGE = {   # class -> (the line as bytes, what the warning must say)
    "binary bytes": (b'{"run_id": "x=2", "params": {"x": 2}, "status": "ok", "note": "\xff\xfe\x00"}',
                     "not UTF-8 (byte 0xff at column"),
    "NUL bytes": (b"\x00\x00\x00\x00", "not a complete JSON row"),
    "run id not a string": (json.dumps({**GOOD, "run_id": 2}).encode(), "'run_id' is 2 (a JSON number), not a string"),
    "run id a path": (json.dumps({**GOOD, "run_id": "../../x=1"}).encode(), "not a run id"),
    "row without parameters": (json.dumps({k: v for k, v in GOOD.items() if k != "params"}).encode(),
                               "no 'params' field"),
    "parameters a list": (json.dumps({**GOOD, "params": [1]}).encode(), "'params' is [1] (a JSON array), not an object"),
    "metrics a list": (json.dumps({**GOOD, "metrics": [1, 2]}).encode(),
                       "'metrics' is [1, 2] (a JSON array), not an object or null"),
    "a metric not flat": (json.dumps({**GOOD, "metrics": {"m": {"a": 1}}}).encode(),
                          "metric 'm' is {\"a\": 1} (a JSON object), not a number, text"),
    "NaN": (b'{"run_id": "x=1", "params": {"x": 1}, "status": "ok", "metrics": {"m": NaN}}', "NaN is not a JSON number"),
    "status unknown": (json.dumps({**GOOD, "status": "done"}).encode(), "'status' is 'done', not one of ok, failed"),
    "not an object": (b'["x=1", {"x": 1}, "ok"]', "a JSON array, not an object"),
    "torn mid-file": (json.dumps(GOOD).encode()[:25], "not a complete JSON row"),
    "an empty line": (b"", "an empty line"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_each_damage_class_is_named_by_file_and_line_and_left_out(damage, tmp_path, capsys):
    line, says = DAMAGE[damage]
    results = tmp_path / "results.jsonl"
    results.write_bytes(json.dumps(GOOD).encode() + b"\n" + line + b"\n" + json.dumps({**GOOD, "run_id": "x=3"}).encode() + b"\n")
    assert [r["run_id"] for r in read_rows(tmp_path)] == ["x=1", "x=3"]
    err = capsys.readouterr().err
    assert f"{results}:2: " in err and says in err, err
    assert err.count("warning:") == 1


def test_damaged_rows_are_named_their_runs_redone_and_the_damaged_file_kept(three_runs, tmp_path, capsys):
    out = copy_of(three_runs, tmp_path)
    results = out / "results.jsonl"
    good = jsonl_rows(results)
    damaged = [json.dumps(good[0]).encode(), DAMAGE["binary bytes"][0],
               json.dumps({**good[1], "run_id": 2}).encode(),                               # run id not a string
               json.dumps({k: v for k, v in good[2].items() if k != "params"}).encode(),    # no parameters
               json.dumps({**good[2], "metrics": list(good[2]["metrics"].values())}).encode(),  # metrics a list
               json.dumps({**good[2], "status": 3}).encode()]
    original = b"\n".join(damaged) + b"\n"
    results.write_bytes(original)
    assert [r["run_id"] for r in read_rows(out)] == [good[0]["run_id"]]
    capsys.readouterr()
    # the report leaves them out, says so on the page and on stderr, and writes nothing into the file
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert results.read_bytes() == original and page.count("data-run-id=") == 1
    assert "5 lines of results.jsonl left out" in page and "Lines left out" in page
    for lineno in range(2, 7):
        assert f"{results}:{lineno}: " in err and f"<code>{results}:{lineno}: " in page
    assert "left out of the report" in err
    # the sweep names each line, keeps the damaged file whole beside it, rewrites the good rows, redoes the rest
    assert main([*SWEEP, "--grid", "x=1,2,3", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    for lineno, says in ((2, "not UTF-8 (byte 0xff"), (3, "'run_id' is 2 (a JSON number), not a string"),
                         (4, "no 'params' field"), (5, "'metrics' is ["), (6, "'status' is 3 (a JSON number), not a string")):
        assert f"{results}:{lineno}: {says}" in err and "a sweep over it redoes it" in err, err
    kept = list(out.glob("results.jsonl.damaged-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == original, kept
    assert f"kept the damaged file whole as {kept[0].name}" in err
    assert "skipping 1 of 3 runs already ok" in err
    after = jsonl_rows(results)                                    # every line a well-formed row again
    assert after[0] == good[0] and sorted(r["run_id"] for r in after) == ["x=1", "x=2", "x=3"]
    assert all(r["status"] == "ok" for r in after)
    # a clean file: the next sweep and report say nothing about damage and keep no other copy
    assert main([*SWEEP, "--grid", "x=1,2,3", "--out", str(out)]) == 0
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err and len(list(out.glob("results.jsonl.damaged-*"))) == 1
    page = (out / "report.html").read_text()
    assert "Lines left out" not in page and kept[0].name in page     # the kept file is named, not read


def test_an_appended_row_is_whole_and_durable(tmp_path):
    with ResultsLog(tmp_path) as log:
        log.append(row("x=1"))
        with pytest.raises(ValueError, match=r"results row: no 'params' field"):
            log.append({"run_id": "x=2", "status": "ok"})
    assert jsonl_rows(tmp_path / "results.jsonl") == [row("x=1")]


# -- workers and kernels die with their runner; a dead runner's orphans are reaped ----------------------
@pytest.mark.skipif(not LINUX or not lifeline.parent_death_supported(), reason="parent-death signals are Linux's")
def test_kill_9_of_a_sweep_takes_its_workers_and_kernels_with_it(tmp_path):
    out, token = tmp_path / "killed", new_mark()
    env = {**os.environ, MARK: token}
    proc = subprocess.Popen([sys.executable, "-m", "nwor_lab.sweep", *SWEEP, "--grid", "x=1,2", "--set",
                             "sleep_s=60", "--out", str(out), "--workers", "2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(marked(token)) < 5 and time.monotonic() < deadline:    # runner + 2 workers + 2 kernels
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        assert len(marked(token)) >= 5, "the kernels never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = wait_gone(token, timeout=10)
        assert not left, f"outlived the runner: {left}"
        assert not (out / "results.jsonl").exists() or not jsonl_rows(out / "results.jsonl")
    finally:
        proc.kill()
        kill_marked(token)


@pytest.mark.skipif(not LINUX, reason="finds processes through /proc")
def test_a_resumed_sweep_reaps_what_a_dead_one_left_running(tmp_path, capsys):
    out = tmp_path / "orphans"
    out.mkdir()
    token = "left-by-a-dead-sweep"
    (out / ".lock").write_text(json.dumps({"pid": 999999, "started": 1, "token": token}))
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, lifeline.MARKER_ENV: token}, start_new_session=True)
    try:
        # Popen returns once exec has begun, but /proc/<pid>/environ reads empty until the kernel has laid
        # out the new image's stack: on a loaded machine the sweep could look before then and find nobody
        # (an orphan a dead sweep left is long past that point)
        deadline = time.monotonic() + 10
        while orphan.pid not in lifeline.marked(token) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert main([*SWEEP, "--grid", "x=1", "--out", str(out)]) == 0
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert "died without cleaning up; stopped 1 processes it left running" in capsys.readouterr().err
        assert (out / ".lock").read_text() == ""                # a clean exit leaves nothing to reap
    finally:
        orphan.kill()


# -- one notebook per folder; lists, dicts and interactive=False reach the notebook -----------------------
def test_a_folder_refuses_another_notebooks_sweep(three_runs, tmp_path, capsys):
    out = copy_of(three_runs, tmp_path)
    other = tmp_path / "other.ipynb"
    shutil.copy(PROBE, other)
    rows = (out / "results.jsonl").read_bytes()
    assert main(["sweep", str(other), "--grid", "x=1,2,3", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"nwor-lab: error: --out {out}: holds the runs of sweep_probe.ipynb, not other.ipynb; a folder "
                   f"holds one notebook's sweep, use another --out (e.g. runs/other)"]
    assert (out / "results.jsonl").read_bytes() == rows


def test_list_values_and_interactive_false_reach_the_notebook(tmp_path):
    out = tmp_path / "lists"
    assert main([*SWEEP, "--grid", "sizes=[1, 2],[3,4,5]", "--set", 'mode={"not": "a mode"}', "--out", str(out)]) == 1
    rows = {r["params"]["sizes"].__repr__(): r for r in jsonl_rows(out / "results.jsonl")}
    assert set(rows) == {"[1, 2]", "[3, 4, 5]"}
    # the dict arrived as a dict: the notebook's mode.upper() fails on it, naming the type
    assert all(r["params"]["mode"] == {"not": "a mode"} for r in rows.values())
    assert all("AttributeError: 'dict' object has no attribute 'upper'" in r["error"] for r in rows.values())
    ok = tmp_path / "lists_ok"
    assert main([*SWEEP, "--grid", "sizes=[1, 2],[3,4,5]", "--out", str(ok)]) == 0
    got = {tuple(r["params"]["sizes"]): r["metrics"] for r in jsonl_rows(ok / "results.jsonl")}
    assert got[(1, 2)]["sizes_sum"] == 3 and got[(3, 4, 5)]["sizes_sum"] == 12
    assert all(m["interactive"] is False for m in got.values())       # injected: no dead widgets saved


# -- the report: each column once, constants in a table, one colour and one order per value ----------------
def synthetic_rows() -> list[dict]:
    rows = []
    for mode in ("stage", "off", "cow"):          # file order differs from the declared order
        for k in (2, 4):
            metrics = {"nwor_mode": mode, "step_ms": {"off": 1.0, "cow": 1.2, "stage": 0.9}[mode] * k,
                       "layers": 8, "window_bytes": 100 * k}
            if mode == "off":
                del metrics["window_bytes"]       # a metric some runs lack must not shift the colours
            rows.append({"run_id": f"k={k},nwor_mode={mode}", "params": {"k": k, "nwor_mode": mode},
                         "status": "ok", "metrics": metrics, "duration_s": 1.0})
    return rows


def test_the_report_shows_each_fact_once_and_keeps_colours_and_order(tmp_path):
    from nwor_lab.sweep.figures import metric_figure, sweep_figures
    from nwor_lab.sweep.report import table_columns

    rows = synthetic_rows()
    params, metrics = table_columns(rows)
    assert params == ["k", "nwor_mode"] and [m for m, _ in metrics] == ["step_ms", "layers", "window_bytes"]
    figures = dict(sweep_figures(rows))                                  # x: k, colour: nwor_mode
    assert set(figures) == {"step_ms", "window_bytes"}                    # `layers` is 8 everywhere: no chart
    colours = {}
    for name, fig in figures.items():
        names = [t.name for t in fig.data]
        assert names == [m for m in ("off", "cow", "stage") if m in names], (name, names)   # declared order
        for t in fig.data:
            assert colours.setdefault(t.name, t.marker.color) == t.marker.color, f"{t.name} changes colour"
    assert len(set(colours.values())) == 3
    by_mode = metric_figure(rows, "step_ms", ["nwor_mode", "k"])        # x: nwor_mode
    assert list(by_mode.layout.xaxis.categoryarray) == ["off", "cow", "stage"]
    with ResultsLog(tmp_path) as log:
        for r in rows:
            log.append(r)
    page = write_report(tmp_path).read_text()
    head = page.split("<thead>")[1].split("</thead>")[0]
    assert head.count(">nwor_mode<") == 1 and head.count(">k<") == 1
    assert "Metrics with one value in every run" in page and '<td class="text">layers</td><td>8</td>' in page
