"""The one error path of every command line of the lab (built in or added later).

A command raises; `run` (behind `nwor_lab.cli.main.main`) catches, once:

  UsageError, and the lab's domain errors        one line `nwor-lab: error: <message>`, exit 2
    (ValueError, TypeError, IndexError, OSError,  the message names the argument, file or
     MemoryError, RuntimeError: CheckpointError,  variable and the fix
     ExtensionBuildError, a failed backend, ...)
  KeyboardInterrupt (Ctrl-C), and SIGTERM, which  exit 128 + the signal (130, 143); a command with
    arrives as `Interrupted`, a KeyboardInterrupt   partial results prints them first (`generate`),
                                                  and every `finally` runs: temporary files go,
                                                  helper processes are stopped
  anything else (AssertionError, ...)             a bug: one line saying so, exit 1

  SystemExit with a message (a library's        the same one line, exit 2 (never swallowed)
    `raise SystemExit("needs a CUDA device")`)

`--traceback` anywhere on the command line, or NWOR_LAB_DEBUG=1, prints the stack as well.
`run(dispatch, argv)` is that path; `nwor-lab`, `python -m nwor_lab.sweep` and
`python -m nwor_lab.workshop` all go through it.
A multi-line message (a compiler's output) is cut to its first line plus the line that says
what failed. Parsers built from `LabArgumentParser` (subparsers inherit it) turn argparse's
usage errors into UsageError too, so they print the same one line.

A new command: `add_parsers(subparsers)` adds its parser with `set_defaults(func=run)`, `run(args)`
returns the exit code and raises UsageError (or lets the lab's errors through) for bad input.
Every flag's value is checked at parse time by a type from `nwor_lab.commandline.args` (ranges, files it
will write, devices), so nothing runs before the whole command line is known to be good.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import traceback
from pathlib import Path

PROG = "nwor-lab"
EXIT_USAGE = 2           # a bad argument, file, environment value (argparse uses 2 as well)
EXIT_BUG = 1
EXIT_INTERRUPTED = 130   # 128 + SIGINT, what shells report for Ctrl-C


class UsageError(Exception):
    """A bad argument, file or environment value. The message names it and says how to fix it."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or another stop signal) delivered as an exception, so a command stops the way Ctrl-C
    stops it (cleanup runs, partial results print); `signum` makes the exit code 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def interrupted_exit_code(err: KeyboardInterrupt) -> int:
    return 128 + getattr(err, "signum", signal.SIGINT)


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


class LabArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2 from `main`) instead of printing its usage."""

    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# Exceptions whose message is about the input, the files or the machine: exit 2.
DOMAIN_ERRORS = (UsageError, ValueError, TypeError, IndexError, OSError, MemoryError, RuntimeError)
BUG_ERRORS = (NotImplementedError, RecursionError)        # RuntimeErrors that are the lab's fault

# The line of a long message (a compiler's output) that says what went wrong.
_TELLING = re.compile(r"not found|no such file|error|cannot|failed|fatal", re.IGNORECASE)


def one_line(err: BaseException) -> str:
    """`err`'s message on one line: its first line, plus the most telling later line if any."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    first = lines[0].rstrip(":")
    if len(lines) == 1:
        return first
    telling = next((line for line in lines[1:] if _TELLING.search(line)), None)
    more = f": {telling}" if telling else ""
    return f"{first}{more} (full output: rerun with --traceback)"


def describe(err: BaseException) -> tuple[int, str]:
    """-> (exit code, the one line to print) for an exception a command raised."""
    if isinstance(err, DOMAIN_ERRORS) and not isinstance(err, BUG_ERRORS):
        return EXIT_USAGE, f"{PROG}: error: {one_line(err)}"
    return EXIT_BUG, (f"{PROG}: internal error: {type(err).__name__}: {one_line(err)}; this is a bug in "
                      f"nwor_lab, rerun with --traceback and report the stack")


def check_output_path(flag: str, path) -> Path:
    """Before any work: `path` can be written (its folder exists and is writable, it is not a
    folder). -> the path. Raises UsageError naming `flag` (the rule: `nwor_lab.commandline.args.output_file`)."""
    from nwor_lab.commandline.args import output_file
    try:
        return Path(output_file(os.fspath(path)))
    except argparse.ArgumentTypeError as err:
        raise UsageError(f"{flag} {err}") from None


def _debug_env() -> bool:
    """NWOR_LAB_DEBUG, read leniently here: a bad value is reported by the command that reads the
    configuration (and by doctor), never by --help."""
    from nwor_lab.config import env_bool
    try:
        return env_bool("NWOR_LAB_DEBUG")
    except ValueError:
        return False


def run(dispatch, argv: list[str]) -> int:
    """The one error path: `dispatch(argv)` -> exit code, with every way a command can fail turned
    into an exit code and at most one line on stderr (plus the stack on request)."""
    argv = list(argv)
    show_stack = "--traceback" in argv or _debug_env()
    argv = [a for a in argv if a != "--traceback"]
    previous = None
    if threading.current_thread() is threading.main_thread():     # signals reach only the main thread
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return dispatch(argv) or 0
    except SystemExit as done:          # --help, parsers that exit themselves, `raise SystemExit("why")`
        code = done.code
        if isinstance(code, int) or code is None:
            return code or 0
        print(f"{PROG}: error: {one_line(SystemExit(code))}", file=sys.stderr)   # never swallow the why
        return EXIT_USAGE
    except BrokenPipeError:             # `nwor-lab generate ... | head`: the reader left, stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt as stop:
        if show_stack:
            traceback.print_exc()
        print(f"{PROG}: interrupted", file=sys.stderr)
        return interrupted_exit_code(stop)
    except Exception as err:  # noqa: BLE001 - the one error path: every command's errors end here
        code, line = describe(err)
        if show_stack:
            traceback.print_exc()
        print(line, file=sys.stderr)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def flag_names(text: str, flags: dict[str, str]) -> str:
    """Rewrite API parameter names in a message as the command's flags, so an engine error names
    what the user typed: `flags` maps a parameter (`max_num_seqs`, or `k=` where a short name is
    only safe before its value) to the flag (`--max-num-seqs`, `--k=`)."""
    for name in sorted(flags, key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])" if name[-1].isalnum() else
                      rf"(?<![\w-]){re.escape(name)}", flags[name], text)
    return text
