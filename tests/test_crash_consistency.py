"""Crash consistency: each long command under SIGINT, SIGTERM and SIGKILL at a random point, and on a
full disk (issue 20).

Commands: generate (streaming), sweep (3 runs of the probe notebook), report, workshop build (one
tiny chapter) and selfcheck (--out). For each command and each signal (SIGTERM for generate and
sweep only: the others take it by the same handler as SIGINT, see `ALIKE`), one run is stopped at a
point drawn from a seeded RNG (`SEED`): generate once its text streams, and workshop build once its
chapter's kernel runs, plus 0-2 s; the others at 20-90 % of the time an uninterrupted run of the
same command took here (`durations`), and then:
- finished results survive: the rows written before the signal are still there, byte for byte,
  and a resume completes the sweep with every run recorded once; generate's streamed text and
  statistics are printed on SIGINT / SIGTERM;
- no process is left behind: every descendant (workers, kernels) carries a marker in its
  environment (`fault_tools.MARK`), and none is alive a few seconds after the command ended;
- no half-written file remains: every output present is whole (JSON parses, HTML ends with
  `</html>`, results.jsonl ends with a newline); a hidden temporary file that a SIGKILL cut short
  may remain, and the next run of the command removes it.
On a full tmpfs (where root allows mounting one; skipped with the reason otherwise), selfcheck,
report, sweep and workshop build end with one line naming the file and "no space left", keep
what was finished, and leave no temporary file.

What happened is recorded (command, signal, delay, exit code, what survived) in a JSON list at
$FAULT_LOG when that is set, and printed once the module's cases ran (visible with `pytest -s`).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fault_tools import (MARK, default_sigint, fill, jsonl_rows, kill_marked, marked, new_mark, temp_leftovers, tmpfs,
                         wait_gone, whole_html, whole_json)

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "data" / "sweep_probe.ipynb"
SEED = 20
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
# SIGTERM reaches every command through the one handler that turns it into Ctrl-C's exception
# (nwor_lab.commandline.errors.run; a sweep's StopFlag takes both signals alike): generate (that
# common path, exit 143) and sweep (its own handler) take it; the other commands SIGINT and SIGKILL.
ALIKE = ["SIGINT", "SIGKILL"]
RECORD: list[dict] = []
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes through /proc"),
              pytest.mark.slow]


def rng_for(command: str, sig: str) -> random.Random:
    return random.Random(f"{SEED}:{command}:{sig}")       # one stream per case: reordering keeps the points


@dataclass
class Started:
    proc: subprocess.Popen
    token: str
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    t0: float = field(default_factory=time.monotonic)

    def finish(self, timeout: float = 120) -> int:
        self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(timeout=10)
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return self.out.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.decode(errors="replace")


def start(argv: list[str], cwd: Path, extra_env: dict | None = None) -> Started:
    """`python -m nwor_lab.cli ARGV` with the marker, stdout/stderr read by threads."""
    token = new_mark()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NWOR_LAB_")}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **{MARK: token}, **(extra_env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "nwor_lab.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    s = Started(proc, token)

    def pump(stream, buf):
        while chunk := stream.read1(65536):
            buf.extend(chunk)
    s.threads = [threading.Thread(target=pump, args=(proc.stdout, s.out), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, s.err), daemon=True)]
    for t in s.threads:
        t.start()
    return s


def stop_after(s: Started, sig: int, delay: float, ready=lambda s: True, ready_timeout: float = 120) -> dict:
    """Wait until `ready(s)`, then `delay` s more, then send `sig`; -> where it landed."""
    deadline = time.monotonic() + ready_timeout
    while not ready(s) and s.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ready_at = time.monotonic() - s.t0
    time.sleep(delay)
    finished_first = s.proc.poll() is not None
    if not finished_first:
        s.proc.send_signal(sig)
    return {"ready_at_s": round(ready_at, 2), "signal_at_s": round(time.monotonic() - s.t0, 2),
            "finished_before_signal": finished_first}


def no_process_left(s: Started) -> None:
    left = wait_gone(s.token, timeout=10)
    if left:
        kill_marked(s.token)
    assert not left, f"processes outlived the command: {left}"


def record(**entry) -> None:
    RECORD.append(entry)


@pytest.fixture(scope="module", autouse=True)
def fault_injection_record():
    """After the module's cases: print (visible with `pytest -s`) and, with $FAULT_LOG, save what every
    case that ran did. A report, not a test: each case asserts its own outcome."""
    yield
    if os.environ.get("FAULT_LOG"):
        Path(os.environ["FAULT_LOG"]).write_text(json.dumps({"seed": SEED, "cases": RECORD}, indent=1) + "\n")
    kills = [r for r in RECORD if r["signal"] in SIGNALS]
    early = sum(bool(r.get("finished_before_signal")) for r in kills)
    print(f"\nfault injection (seed {SEED}): {len(kills)} signals ({early} landed after the command had "
          f"finished), {len(RECORD) - len(kills)} full-disk runs")
    for r in RECORD:
        where = (f"{r['signal_at_s']:>6.2f} s (ready {r['ready_at_s']:.2f} + {r['delay_s']:.2f})"
                 if "signal_at_s" in r else "")
        print(f"  {r['command']:<15} {r['signal']:<9} {where:<32} exit {r['exit_code']!s:<5} {r['survived']}")


def sweep_argv(out: Path) -> list[str]:
    return ["sweep", str(PROBE), "--grid", "x=1,2,3", "--set", "sleep_s=0.3", "--out", str(out), "--no-progress"]


def workshop_argv(kit: Path) -> list[str]:
    return ["workshop", "build", "--chapters", str(PROBE), "--out", str(kit)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict[str, float], Path]:
    """Seconds an uninterrupted run of each command takes on this machine now (the signals land
    inside that span, wherever the suite runs), and the finished sweep folder (for the reports)."""
    where = tmp_path_factory.mktemp("reference")
    sweep = where / "sweep"
    # (workshop build is stopped once its chapter's kernel runs: it needs no reference run)
    runs = {"sweep": sweep_argv(sweep), "report": ["report", str(sweep)],
            "selfcheck": ["selfcheck", "--out", str(where / "sc.json")]}
    took = {}
    for name, argv in runs.items():
        s = start(argv, where)
        assert s.finish() == 0, s.stderr
        took[name] = time.monotonic() - s.t0
    (sweep / "report.html").unlink()
    return took, sweep


@pytest.fixture(scope="module")
def durations(reference) -> dict[str, float]:
    return reference[0]


@pytest.fixture(scope="module")
def finished_sweep(reference) -> Path:
    return reference[1]


def point_in(durations: dict, command: str, sig: str) -> float:
    return rng_for(command, sig).uniform(0.2, 0.9) * durations[command]


# -- generate ---------------------------------------------------------------------------------------
PROMPT = "def parse_args(argv):"


@pytest.mark.parametrize("sig", list(SIGNALS))
def test_generate_under_a_signal(sig, tmp_path):
    delay = rng_for("generate", sig).uniform(0.0, 2.0)
    s = start(["generate", PROMPT, "--max-new-tokens", "600", "--stream"], tmp_path)
    point = stop_after(s, SIGNALS[sig], delay, ready=lambda s: len(s.out) > len(PROMPT) + 8)
    code = s.finish()
    no_process_left(s)
    streamed = s.stdout
    assert streamed.startswith(PROMPT)
    if sig == "SIGKILL":
        assert code == -signal.SIGKILL
        survived = f"{len(streamed) - len(PROMPT)} characters streamed before the kill stay printed"
    else:
        assert code == 128 + SIGNALS[sig], (code, s.stderr)
        last = streamed.strip().splitlines()[-1]
        assert last.endswith("(interrupted: statistics so far)") and "mean acceptance length" in last
        assert s.stderr.strip().splitlines() == [s.stderr.strip()] and "interrupted after" in s.stderr
        survived = f"text so far ({len(streamed)} chars) and statistics printed, exit {code}"
    assert not list(tmp_path.iterdir())                          # generate writes no file
    record(command="generate", signal=sig, delay_s=round(delay, 2), **point, exit_code=code, survived=survived)


# -- sweep --------------------------------------------------------------------------------------------
def check_sweep_folder(out: Path) -> list[dict]:
    rows = jsonl_rows(out / "results.jsonl")                     # whole lines only, newline-terminated
    for nb in (out / "notebooks").glob("*.ipynb") if (out / "notebooks").exists() else []:
        assert whole_json(nb), f"half-written {nb}"
    return rows


@pytest.mark.parametrize("sig", list(SIGNALS))
def test_sweep_under_a_signal_then_resume(sig, tmp_path, durations):
    out = tmp_path / "sweep"
    delay = point_in(durations, "sweep", sig)
    s = start(sweep_argv(out), tmp_path)
    point = stop_after(s, SIGNALS[sig], delay)
    code = s.finish()
    no_process_left(s)
    before = check_sweep_folder(out) if out.exists() else []
    # (a signal that lands once every run is recorded, while the process exits, may find nothing to stop:
    # exit 0, or the interpreter's default action once it has restored the handlers on its way out)
    done_anyway = code in (0, -SIGNALS[sig]) and len(before) == 3 and sig != "SIGKILL"
    if not point["finished_before_signal"] and not done_anyway:
        assert code == (-signal.SIGKILL if sig == "SIGKILL" else 128 + SIGNALS[sig]), (code, s.stderr)
    if sig != "SIGKILL" and out.exists():
        assert not (out / ".work").exists() and not temp_leftovers(out)
    r = start(sweep_argv(out), tmp_path)
    assert r.finish() == 0, r.stderr
    no_process_left(r)
    after = check_sweep_folder(out)
    assert after[: len(before)] == before                        # finished rows kept, byte for byte
    assert sorted(x["run_id"] for x in after) == ["x=1", "x=2", "x=3"]   # each run recorded once, all ok
    assert all(x["status"] == "ok" for x in after)
    assert not (out / ".work").exists() and not temp_leftovers(out)
    assert f"skipping {len(before)} of 3" in r.stderr or not before
    record(command="sweep", signal=sig, delay_s=round(delay, 2), **point, exit_code=code,
           uninterrupted_s=round(durations["sweep"], 2),
           survived=f"{len(before)} of 3 rows finished before the signal kept; resume ran {3 - len(before)}")


# -- report -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", ALIKE)
def test_report_under_a_signal(sig, finished_sweep, tmp_path, durations):
    out = tmp_path / "sweep"
    shutil.copytree(finished_sweep, out)
    page = out / "report.html"
    page.write_text("<html>the previous report</html>")
    delay = point_in(durations, "report", sig)
    s = start(["report", str(out)], tmp_path)
    point = stop_after(s, SIGNALS[sig], delay)
    code = s.finish()
    no_process_left(s)
    assert whole_html(page), "report.html is half-written"
    new = "the previous report" not in page.read_text()
    if sig != "SIGKILL":
        assert not temp_leftovers(out)                           # SIGINT / SIGTERM: its own cleanup ran
    else:                                                        # SIGKILL: the next run cleans up
        r = start(["report", str(out)], tmp_path)
        assert r.finish() == 0 and whole_html(page) and not temp_leftovers(out), r.stderr
    record(command="report", signal=sig, delay_s=round(delay, 2), **point, exit_code=code,
           uninterrupted_s=round(durations["report"], 2),
           survived=("the new report, whole" if new else "the previous report, whole") + "; no temp file"
           + ("" if sig != "SIGKILL" else " after the rerun"))


# -- workshop build -----------------------------------------------------------------------------------
def check_kit(kit: Path) -> None:
    for p in list(kit.glob("*.html")):
        assert whole_html(p), f"half-written {p}"
    for p in list(kit.glob("executed/*.ipynb")) + list(kit.glob("index.json")):
        assert whole_json(p), f"half-written {p}"


@pytest.mark.parametrize("sig", ALIKE)
def test_workshop_build_under_a_signal(sig, tmp_path):
    kit = tmp_path / "kit"
    argv = workshop_argv(kit)
    delay = rng_for("workshop", sig).uniform(0.0, 2.0)        # after the chapter's kernel is up
    s = start(argv, tmp_path)
    point = stop_after(s, SIGNALS[sig], delay, ready=lambda s: len(marked(s.token)) >= 2)
    code = s.finish()
    no_process_left(s)                                           # the chapter's kernel too
    check_kit(kit) if kit.exists() else None
    present = sorted(str(p.relative_to(kit)) for p in kit.rglob("*") if p.is_file()) if kit.exists() else []
    if sig != "SIGKILL":                                         # its own cleanup ran
        assert not (kit / ".work").exists() and (not kit.exists() or not temp_leftovers(kit))
    else:
        r = start(argv, tmp_path)
        assert r.finish() == 0, r.stderr
        no_process_left(r)
        check_kit(kit)
        assert (kit / "index.html").exists() and not (kit / ".work").exists() and not temp_leftovers(kit)
    record(command="workshop build", signal=sig, delay_s=round(delay, 2), **point, exit_code=code,
           survived=f"{len(present)} file(s) present after the signal, all whole"
           + ("; the rebuild completed, no .work or temp left" if sig == "SIGKILL" else ""))


# -- selfcheck ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", ALIKE)
def test_selfcheck_under_a_signal(sig, tmp_path, durations):
    out = tmp_path / "selfcheck.json"
    out.write_text('{"previous": true}\n')
    delay = point_in(durations, "selfcheck", sig)
    s = start(["selfcheck", "--out", str(out)], tmp_path)
    point = stop_after(s, SIGNALS[sig], delay)
    code = s.finish()
    no_process_left(s)
    assert whole_json(out), "selfcheck.json is half-written"
    new = "previous" not in out.read_text()
    if sig != "SIGKILL":
        assert not temp_leftovers(tmp_path)
    else:
        r = start(["selfcheck", "--out", str(out)], tmp_path)
        assert r.finish() == 0 and json.loads(out.read_text())["ok"] and not temp_leftovers(tmp_path), r.stderr
    record(command="selfcheck", signal=sig, delay_s=round(delay, 2), **point, exit_code=code,
           uninterrupted_s=round(durations["selfcheck"], 2),
           survived="the new result, whole" if new else "the previous result, whole")


# -- a full disk --------------------------------------------------------------------------------------
def one_line_no_space(s: Started, path_part: str) -> str:
    lines = s.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("nwor-lab: error: ") and "no space left on device" in lines[-1], s.stderr
    assert path_part in lines[-1] and "Traceback" not in s.stderr, lines[-1]
    return lines[-1]


def test_full_disk_selfcheck_keeps_its_result_and_names_the_file(tmp_path):
    with tmpfs("256k") as disk:
        out = disk / "selfcheck.json"
        out.write_text('{"previous": true}\n')
        fill(disk)
        s = start(["selfcheck", "--out", str(out)], tmp_path)
        code = s.finish()
        no_process_left(s)
        line = one_line_no_space(s, str(out))
        assert code == 2 and json.loads(s.stdout)["ok"]            # the result was printed first
        assert out.read_text() == '{"previous": true}\n' and not temp_leftovers(disk)
    record(command="selfcheck", signal="full disk", exit_code=code, survived="result on stdout; previous file intact",
           message=line)


def test_full_disk_report_names_the_file_and_leaves_no_temp(finished_sweep, tmp_path):
    with tmpfs("1m") as disk:
        out = disk / "sweep"
        shutil.copytree(finished_sweep, out, ignore=shutil.ignore_patterns("notebooks", "logs"))
        fill(disk)
        s = start(["report", str(out)], tmp_path)
        code = s.finish()
        line = one_line_no_space(s, "report.html")
        assert code == 2 and not (out / "report.html").exists() and not temp_leftovers(disk)
    record(command="report", signal="full disk", exit_code=code, survived="no report.html.tmp or temp file",
           message=line)


def test_full_disk_mid_sweep_stops_in_one_line_keeps_rows_and_resumes(tmp_path):
    with tmpfs("8m") as disk:
        out = disk / "sweep"
        s = start(["sweep", str(PROBE), "--grid", "x=1,2,3", "--set", "sleep_s=1.5", "--out", str(out),
                   "--no-progress"], tmp_path)
        deadline = time.monotonic() + 120
        while not jsonl_rows(out / "results.jsonl") and s.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        filler = fill(disk)                                        # the disk fills while run 2 works
        code = s.finish()
        no_process_left(s)
        line = one_line_no_space(s, str(out))
        before = check_sweep_folder(out)
        assert code == 2 and 1 <= len(before) < 3 and all(r["status"] == "ok" for r in before)
        assert not temp_leftovers(out)
        filler.unlink()
        r = start(["sweep", str(PROBE), "--grid", "x=1,2,3", "--set", "sleep_s=1.5", "--out", str(out),
                   "--no-progress"], tmp_path)
        assert r.finish() == 0, r.stderr
        after = check_sweep_folder(out)
        assert after[: len(before)] == before and sorted(x["run_id"] for x in after) == ["x=1", "x=2", "x=3"]
    record(command="sweep", signal="full disk", exit_code=code,
           survived=f"{len(before)} finished row(s) kept; resume completed the other {3 - len(before)}", message=line)


def test_full_disk_workshop_build_names_the_file(tmp_path):
    with tmpfs("1m") as disk:
        kit = disk / "kit"
        kit.mkdir()
        fill(disk)
        s = start(["workshop", "build", "--chapters", str(PROBE), "--out", str(kit)], tmp_path)
        code = s.finish()
        no_process_left(s)
        line = one_line_no_space(s, str(kit))
        assert code == 2 and not temp_leftovers(disk)
        check_kit(kit)
    record(command="workshop build", signal="full disk", exit_code=code, survived="no half-written file",
           message=line)
