"""The command line's one validation layer and one error path (issue 20).

- every flag of every `nwor-lab` parser (the benchmarks' included) that takes a value is checked at
  parse time: a type from `nwor_lab.commandline.args`, or `choices`, or it is a free-form text that its
  command checks before any work (listed below with the check);
- a message carried by SystemExit is printed as the one line, never swallowed;
- Ctrl-C under `generate --tp 2` prints what was generated and exits 130, leaving no rank behind.
The error shape of each flag (exit 2, one line naming the flag, the value and what is allowed) is
checked case by case in tests/test_cli_errors.py.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, run

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = ("kernels", "policies", "engine", "step", "attention", "tp", "tree", "state", "disagg", "prefix")

# Flags whose value is free text by nature, and where their command checks it before any work.
FREE_TEXT = {
    "grid": "nwor_lab.sweep.grid.parse_grid",
    "set": "nwor_lab.sweep.grid.parse_set",
    "notebook": "nwor_lab.sweep.plan.notebook_parameters (a readable .ipynb)",
    "kernel": "nwor_lab.sweep.plan.check_kernel (an installed Jupyter kernel)",
    "checkpoint": "cli.generate: an existing folder, then the loaders name each file",
    "chapters": "workshop build: at least one chapter matches",
    "run_dir": "report: holds results.jsonl",
    "rest": "generate's placeholder in the top-level help (its own parser checks)",
    "what": "bench: choices",
    "acceptance": "bench state / bench engine --model 8b: acceptance_text (ForcedAcceptance.parse)",
}


class _Parsed(Exception):
    pass


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    """prog -> parser, for the top-level command tree, generate, and each benchmark (captured
    when its `main` parses)."""
    from nwor_lab.cli.main import build_parser
    from nwor_lab.commandline import generate_flags

    found: dict[str, argparse.ArgumentParser] = {}

    def walk(p):
        found[p.prog] = p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
    walk(build_parser())
    walk(generate_flags.parser())
    original = LabArgumentParser.parse_args

    def capture(self, *a, **kw):
        found[self.prog] = self
        raise _Parsed
    LabArgumentParser.parse_args = capture
    try:
        import importlib
        for name in BENCHMARKS:
            with pytest.raises(_Parsed):
                importlib.import_module(f"nwor_lab.bench.{name}").main([])
    finally:
        LabArgumentParser.parse_args = original
    return found


def test_every_flag_is_checked_at_parse_time():
    parsers = all_parsers()
    assert {f"nwor-lab bench {b}" for b in BENCHMARKS} <= set(parsers)
    unchecked = []
    for prog, parser in parsers.items():
        assert isinstance(parser, LabArgumentParser), f"{prog}: not a LabArgumentParser (its errors would not be one line)"
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction,
                                                         argparse.BooleanOptionalAction)):
                continue
            typed = getattr(action.type, "__module__", None) == types.__name__
            if not (typed or action.choices is not None or action.dest in FREE_TEXT):
                unchecked.append(f"{prog} {'/'.join(action.option_strings) or action.dest}")
    assert not unchecked, "flags without a check from nwor_lab.commandline.args: " + ", ".join(unchecked)


def test_a_system_exit_message_is_printed_not_swallowed(capsys):
    def dispatch(argv):
        raise SystemExit("bench kernels needs a CUDA device")
    assert run(dispatch, []) == 2
    assert capsys.readouterr().err == "nwor-lab: error: bench kernels needs a CUDA device\n"
    assert run(lambda argv: (_ for _ in ()).throw(SystemExit(0)), []) == 0


@pytest.mark.parametrize("parse, text, message", [
    (types.seconds, "nan", "must be a finite number of seconds > 0, got 'nan'"),
    (types.seconds, "0", "must be a finite number of seconds > 0, got '0'"),
    (types.seed, str(2 ** 63), "must be >= 0 and <= 9223372036854775807"),
    (types.device, "meta", "the lab runs on cpu, cuda or cuda:N; got 'meta'"),
    (types.prompt, "\udcff", "not valid UTF-8 text (byte ff at character 0)"),
    (types.listed(types.integer(1), "sizes"), "1,1", "a value is repeated"),
])
def test_types_name_what_is_allowed(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(text)


def rank_processes(parent: int) -> list[int]:
    """Live children of `parent` (the spawned ranks), from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if int(fields[1]) == parent and fields[0] != b"Z":
                out.append(int(entry))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_under_tensor_parallel_generate_prints_what_was_generated():
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "nwor_lab.cli", "generate", "def parse_args(argv):", "--tp", "2",
                             "--max-new-tokens", "1000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while len(rank_processes(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(8)                         # the ranks load the pair and generate a while
        assert proc.poll() is None, proc.communicate()
        ranks = rank_processes(proc.pid)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert out.startswith("def parse_args(argv):")
    last = out.strip().splitlines()[-1]
    assert "target forwards, mean acceptance length" in last and last.endswith("(interrupted: statistics so far)")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nwor-lab: interrupted after"), err
    def alive(pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            return False
        return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"      # a zombie has ended
    deadline = time.monotonic() + 10          # the ranks (and multiprocessing's resource tracker) end
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ranks if alive(p)], "a rank outlived the command"
