"""Child processes that cannot outlive the process that started them.

A command that starts helpers (sweep workers, their Jupyter kernels, tensor-parallel ranks) ties
them to itself two ways, because `kill -9` gives it no chance to clean up:

- `die_with_parent()`, run in the child (as `Popen(preexec_fn=...)` or first thing in its main):
  Linux delivers SIGKILL to the child the moment its parent dies (`prctl(PR_SET_PDEATHSIG)`).
  A no-op elsewhere.
- a marker: the starter puts `MARKER_ENV=<token>` in the children's environment (their children
  inherit it); `marked(token)` finds every process that still carries it, `reap(token)` kills
  them. A sweep records its token next to its lock so that the next sweep in the same folder
  reaps what a dead one left (on systems without parent-death signals, or for a grandchild that
  escaped its parent).

Torch-free; Linux reads /proc, other systems find nothing to reap.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import time

MARKER_ENV = "NWOR_LAB_OWNER"
_PR_SET_PDEATHSIG = 1

_prctl = None
if sys.platform.startswith("linux"):
    try:  # loaded once in the parent, so a preexec_fn only calls it (no import after fork)
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; exit at once if the parent
    (`expected_parent`, when given) is already gone. Safe in a `preexec_fn` (no allocation-heavy
    work, no imports)."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:   # it died before prctl
        os._exit(1)


def parent_death_supported() -> bool:
    return _prctl is not None


def stat_fields(stat: bytes) -> list[bytes]:
    """The fields of a /proc/<pid>/stat line after "pid (comm) ": state, ppid, ... (comm may hold
    spaces and parentheses, so split after its last ")")."""
    return stat[stat.rfind(b")") + 2:].split()


def processes(name: str):
    """(pid, contents of /proc/<pid>/<name>) for every process whose file can be read (Linux; nothing
    elsewhere): one gone meanwhile, or not ours to read, is passed over."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/{name}", "rb") as f:
                yield int(entry), f.read()
        except OSError:
            continue


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None:
    with the pid, it names one process even after pids wrap around."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat_fields(stat)
    return int(fields[19]) if len(fields) > 19 else None


def alive(pid: int, started: int | None = None) -> bool:
    """`pid` runs (and, given `started`, is the same process that started then)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if started is not None:
        now = start_time(pid)
        return now is None or now == started
    return True


def marked(token: str) -> list[int]:
    """Pids of live processes (other than this one) whose environment holds `MARKER_ENV=token`."""
    needle = b"\0" + f"{MARKER_ENV}={token}".encode() + b"\0"
    return [pid for pid, env in processes("environ") if pid != os.getpid() and needle in b"\0" + env + b"\0"]


def reap(token: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process marked with `token` (and the process group it leads, if any: a sweep
    worker leads its own), wait until none is left; -> the pids that were killed. A zombie has an
    empty environment, so a killed child not yet waited for no longer counts."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while (pids := marked(token)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                if os.getpgid(pid) == pid and pid != os.getpgid(0):
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.05)
    return killed


def kernel_manager_class():
    """A jupyter_client kernel manager whose kernels die with the process that started them (pass
    it to papermill as `kernel_manager_class=`). jupyter_client starts a kernel in a session of its
    own, so neither a process group nor Ctrl-C reaches it; its own parent poller notices a dead
    parent only while the notebook's code lets that thread run."""
    from jupyter_client.manager import AsyncKernelManager

    class KernelDiesWithParent(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            parent = os.getpid()
            kw.setdefault("preexec_fn", lambda: die_with_parent(parent))
            return await super()._async_launch_kernel(kernel_cmd, **kw)

        async def _async_interrupt_kernel(self):
            # jupyter_client (8.x) sends SIGINT before every shutdown request. When the notebook is done,
            # that signal can land while ipykernel is still finishing the last cell's reply, which it
            # logs to the terminal as "KeyboardInterrupt caught in kernel." at the end of a clean run.
            # A kernel still running a cell when it is shut down gets the shutdown request, and after
            # jupyter_client's wait, SIGKILL: nothing needs the interrupt.
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return KernelDiesWithParent


@contextlib.contextmanager
def environment(**values):
    """`values` in os.environ for the block (None: the name unset), the old values back after it:
    what the children started inside the block inherit."""
    old = {k: os.environ.get(k) for k in values}
    _set_environment(values)
    try:
        yield
    finally:
        _set_environment(old)


def _set_environment(values: dict) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
