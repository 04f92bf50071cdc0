"""Helpers for the fault-injection tests: a small tmpfs (full or read-only disks), processes found by a
marker in their environment, checks that a file is whole, and a deadline for calls that could hang."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from nwor_lab import lifeline
from nwor_lab.atomic import TMP_MARK

MARK = "NWOR_TEST_CRASH_MARK"       # set by a test on the command it starts; every descendant inherits it


def default_sigint() -> None:
    """`preexec_fn` of a child a test interrupts: Ctrl-C's default action, as at a terminal. A child
    inherits an ignored SIGINT (a shell's background job, some test runners' workers), and Python
    then installs no KeyboardInterrupt handler: the test's SIGINT would reach nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Hung(TimeoutError):
    """A call still running after its `deadline`: a hang, reported instead of hanging the suite."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail instead of hanging when the block runs longer than `seconds` (SIGALRM: main thread only)."""
    def on_alarm(signum, frame):
        raise Hung(f"still running after {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def new_mark() -> str:
    return uuid.uuid4().hex


def marked(token: str) -> list[int]:
    """Live processes (zombies excluded: their environment reads empty) carrying MARK=token."""
    needle = f"{MARK}={token}".encode()
    return [pid for pid, env in lifeline.processes("environ") if pid != os.getpid() and needle in env.split(b"\0")]


def wait_gone(token: str, timeout: float = 10.0) -> list[int]:
    """Wait until no process carries the mark; -> those still there after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (left := marked(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_marked(token: str) -> None:
    """Clean up after a failed assertion, so one test's leftovers cannot fail the next."""
    import signal
    for pid in marked(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def mount_error() -> str | None:
    """Why a tmpfs cannot be mounted here (None: it can)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if not shutil.which("mount"):
        return "no mount command"
    return None


@contextlib.contextmanager
def tmpfs(size: str = "2m", readonly: bool = False):
    """A fresh tmpfs of `size` (a full disk is one `fill` away), or skip with the reason."""
    why = mount_error()
    if why:
        pytest.skip(why)
    where = Path(tempfile.mkdtemp(prefix="nwor_tmpfs_"))
    opts = f"size={size}" + (",ro" if readonly else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        with contextlib.suppress(OSError):
            where.rmdir()


def remount(where: Path, readonly: bool) -> None:
    subprocess.run(["mount", "-o", f"remount,{'ro' if readonly else 'rw'}", str(where)], check=True,
                   capture_output=True)


def fill(folder: Path) -> Path:
    """Fill the file system of `folder` up to the last byte (a filler file)."""
    filler = folder / ".filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    return filler


def temp_leftovers(folder: Path) -> list[str]:
    """Temporary files of nwor_lab.atomic anywhere under `folder`."""
    return [str(p.relative_to(folder)) for p in folder.rglob(f"*{TMP_MARK}*")]


def whole_json(path: Path) -> bool:
    try:
        json.loads(path.read_text(encoding="utf-8"))
        return True
    except (OSError, ValueError):
        return False


def whole_html(path: Path) -> bool:
    try:
        return path.read_text(encoding="utf-8").rstrip().endswith("</html>")
    except (OSError, ValueError):
        return False


def jsonl_rows(path: Path) -> list[dict]:
    """Every line of results.jsonl, each required to be one whole JSON object ending in a newline."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    assert not raw or raw.endswith(b"\n"), f"{path} ends in a torn row"
    return [json.loads(line) for line in raw.decode().splitlines()]
