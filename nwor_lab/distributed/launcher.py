"""Start the ranks of a tensor-parallel run and bring back their results, or the first failure.

    results = launch(fn, tp=2, args=(...,), device="cpu")     # fn(group: TPGroup, *args) per rank

`launch` spawns `tp` processes with `torch.multiprocessing` (start method `spawn`), each of which
initialises `torch.distributed` (NCCL on CUDA with rank r on `cuda:r`, gloo on CPU; a FileStore in
a fresh temporary folder, so no port is guessed) with a collective timeout, calls `fn(group, *args)`
and sends its result back (`torch.save` bytes over a pipe). The parent watches every rank's pipe
and process at once:

- all ranks report: their results, in rank order;
- a rank raises: it reports the exception (with its traceback) and exits; a rank that dies without
  a word (os._exit, a signal, the OOM killer) is seen by its exit code. Its peers, blocked in a
  collective, fail within the collective timeout (gloo: at once, the connection closes) with a
  `CollectiveError`. The parent waits a moment for the other reports, terminates whatever still
  runs and raises `TensorParallelError`, naming the rank that failed first on its own (a
  CollectiveError is a consequence, reported only when nothing else failed) with its error text.
  Nothing waits longer than the collective timeout plus a few seconds.

Ranks die with the parent (a parent-death signal, `nwor_lab.lifeline`), so `kill -9` of the command
leaves no rank behind. With `interruptible=True` the ranks ignore SIGINT and the parent owns Ctrl-C:
the first one sets a stop flag that `fn` polls (`stop_requested()`; the ranks must agree on when
they stop, e.g. rank 0 broadcasts its reading), and the ranks return what they have; a second
Ctrl-C stops them at once (KeyboardInterrupt).

Under `torchrun` (RANK / WORLD_SIZE set) the process already is a rank: `run_ranks` runs `fn` in
it (`TPGroup.from_env`) instead of spawning, and returns only this rank's result.
"""
from __future__ import annotations

import io
import os
import signal
import tempfile
import time
import traceback
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp

from nwor_lab import lifeline
from nwor_lab.distributed.group import DEFAULT_TIMEOUT_S, CollectiveError, TPGroup, default_backend

GRACE_S = 2.0        # after a first failure: how long to wait for the other ranks' reports
_stop = None         # in a rank: the launcher's stop flag (an Event) when the run is interruptible


def stop_requested() -> bool:
    """In a rank of an interruptible run: True once the parent got Ctrl-C (False elsewhere)."""
    return _stop is not None and _stop.is_set()


class TensorParallelError(RuntimeError):
    """A rank of a tensor-parallel run failed; the message names it and carries its error. `rank`: the
    rank that failed first on its own (or the one that stopped answering); `failures`: every report."""

    def __init__(self, message: str, rank: int | None = None, failures: list | None = None):
        super().__init__(message)
        self.rank, self.failures = rank, failures or []


def in_torchrun() -> bool:
    """True in a process started by torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank_devices(device, tp: int) -> list[torch.device]:
    """Rank r's device: `cuda:r` (of the visible GPUs) for a CUDA run, the CPU otherwise."""
    device = torch.device(device)
    if device.type != "cuda":
        return [device] * tp
    n = torch.cuda.device_count()
    if n < tp:
        raise ValueError(f"tp={tp}: needs {tp} CUDA devices, {n} visible (CUDA_VISIBLE_DEVICES)")
    return [torch.device("cuda", i) for i in range(tp)]


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


def _rank_main(rank, tp, device, backend, init_method, timeout_s, threads, fn, args, conn, parent=None,
               stop=None):
    """One rank: init the group, run fn, report ("ok", bytes) or ("error", ...) on `conn`."""
    global _stop
    lifeline.die_with_parent(parent)
    if stop is not None:          # the parent owns Ctrl-C and tells the ranks through `stop`
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop = stop
    try:
        if threads:
            torch.set_num_threads(threads)
        group = TPGroup.init(rank, tp, device, backend, init_method, timeout_s)
        result = fn(group, *args)
        conn.send(("ok", rank, time.time(), _dumps(result)))
    except BaseException as err:  # noqa: BLE001 - report everything, KeyboardInterrupt included
        kind = "collective" if isinstance(err, CollectiveError) else "error"
        try:
            conn.send(("error", rank, time.time(), kind, f"{type(err).__name__}: {err}", traceback.format_exc()))
        finally:
            conn.close()
            os._exit(1)      # no destroy_process_group: a peer may be gone, teardown could block
    conn.close()
    try:
        torch.distributed.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def launch(fn, tp: int, args=(), *, device="cpu", backend: str | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S, init_method: str | None = None,
           threads: int | None = None, run_timeout_s: float | None = None, interruptible: bool = False) -> list:
    """Run `fn(group, *args)` on `tp` new processes (ranks); -> their results in rank order.

    device: "cpu" (gloo) or "cuda" (NCCL, rank r on cuda:r); backend overrides the choice.
    timeout_s: the collective timeout (a peer missing longer is an error on the waiting ranks).
    threads: torch threads per rank (default: the CPU cores split over the ranks, on CPU).
    run_timeout_s: give up on the whole run after this long (None: no limit).
    interruptible: the first Ctrl-C asks `fn` to stop (`stop_requested()`), see the module docstring.
    `fn` and `args` must be picklable (a module-level function). Raises TensorParallelError."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r}: expected an integer >= 1")
    devices = rank_devices(device, tp)
    backend = backend or default_backend(devices[0])
    if threads is None and devices[0].type == "cpu":
        threads = max(1, (os.cpu_count() or 1) // tp)
    tmp = tempfile.TemporaryDirectory(prefix="nwor_tp_")
    init_method = init_method or f"file://{os.path.join(tmp.name, 'store')}"
    ctx = mp.get_context("spawn")
    stop = ctx.Event() if interruptible else None
    procs, conns = [], {}
    try:
        for rank in range(tp):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_rank_main, name=f"nwor-tp-rank{rank}", daemon=True,
                            args=(rank, tp, devices[rank], backend, init_method, timeout_s, threads, fn, args, send,
                                  os.getpid(), stop))
            p.start()
            send.close()
            procs.append(p)
            conns[recv] = rank
        return _supervise(procs, conns, run_timeout_s, timeout_s, stop)
    finally:
        _stop(procs)
        tmp.cleanup()


def _supervise(procs, conns, run_timeout_s, timeout_s, stop=None) -> list:
    """`_watch` the ranks; for an interruptible run the first Ctrl-C only sets `stop` (a handler, so
    no exception lands inside the bookkeeping), the second raises KeyboardInterrupt."""
    import threading
    if stop is None or threading.current_thread() is not threading.main_thread():
        return _watch(procs, conns, run_timeout_s, timeout_s)

    def on_sigint(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()                                 # the ranks stop at their next agreed point

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        return _watch(procs, conns, run_timeout_s, timeout_s)
    finally:
        signal.signal(signal.SIGINT, previous)


def _watch(procs, conns, run_timeout_s, timeout_s) -> list:
    results: dict[int, object] = {}
    failures: list[dict] = []
    first_failure_at = None
    start = time.monotonic()
    sentinels = {p.sentinel: r for r, p in enumerate(procs)}
    open_conns = dict(conns)
    while len(results) < len(procs):
        now = time.monotonic()
        if first_failure_at is not None and (now - first_failure_at > GRACE_S or
                                             all(not p.is_alive() for p in procs)):
            break
        if run_timeout_s is not None and now - start > run_timeout_s:
            failures.append({"rank": None, "time": time.time(), "kind": "timeout",
                             "error": f"the run took longer than {run_timeout_s:g} s", "traceback": ""})
            break
        ready = wait(list(open_conns) + list(sentinels), timeout=0.2)
        for obj in ready:
            if obj in open_conns:
                rank = open_conns[obj]
                try:
                    msg = obj.recv()
                except (EOFError, OSError):
                    del open_conns[obj]
                    continue
                if msg[0] == "ok":
                    results[rank] = _loads(msg[3])
                else:
                    failures.append({"rank": rank, "time": msg[2], "kind": msg[3], "error": msg[4],
                                     "traceback": msg[5]})
                    first_failure_at = first_failure_at or time.monotonic()
        for obj in ready:
            if obj in sentinels:
                rank = sentinels.pop(obj)
                p = procs[rank]
                p.join(0.1)
                # a report sent just before exiting is still in the pipe: read it first
                for c, r in list(open_conns.items()):
                    if r == rank and c.poll(0.5):
                        try:
                            msg = c.recv()
                        except (EOFError, OSError):
                            msg = None
                        if msg and msg[0] == "ok":
                            results[rank] = _loads(msg[3])
                        elif msg:
                            failures.append({"rank": rank, "time": msg[2], "kind": msg[3], "error": msg[4],
                                             "traceback": msg[5]})
                        del open_conns[c]
                reported = rank in results or any(f["rank"] == rank for f in failures)
                if not reported:
                    code = p.exitcode
                    how = f"was killed by signal {-code}" if code is not None and code < 0 else \
                        f"exited with code {code}"
                    failures.append({"rank": rank, "time": time.time(), "kind": "died",
                                     "error": f"the process {how} without reporting an error "
                                              f"(os._exit, a signal, out of memory?)", "traceback": ""})
                if failures:
                    first_failure_at = first_failure_at or time.monotonic()
    if not failures and len(results) == len(procs):
        return [results[r] for r in range(len(procs))]
    silent = [r for r, p in enumerate(procs) if r not in results and not any(f["rank"] == r for f in failures)]
    raise _error(failures, len(procs), timeout_s, silent)


def _error(failures: list[dict], tp: int, timeout_s: float, silent=()) -> TensorParallelError:
    """The failure to name: the earliest one that is not a peer's consequence (a CollectiveError).
    `silent`: ranks still running without a word when the run was stopped."""
    if not failures:
        return TensorParallelError(f"tensor-parallel run (tp={tp}) ended without results from every rank")
    own = [f for f in failures if f["kind"] != "collective"]
    first = min(own or failures, key=lambda f: f["time"])
    who = "the launcher" if first["rank"] is None else f"rank {first['rank']}"
    stuck = f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}" if silent else "a rank"
    if first["kind"] == "died":
        what = f"{who} {first['error']}"
    elif first["kind"] == "collective":
        what = (f"{stuck} stopped answering: {who}'s collective waited longer than the {timeout_s:g} s "
                f"collective timeout ({first['error']})")
    elif first["kind"] == "timeout":
        what = first["error"]
    else:
        what = f"{who} raised {first['error']}"
    others = [f for f in failures if f is not first and f["rank"] is not None]
    tail = "".join(f"\n  rank {f['rank']}: {_short(f['error'])}" for f in others)
    if silent and first["kind"] != "collective":
        tail += f"\n  rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}: no report (stopped)"
    msg = (f"tensor-parallel run (tp={tp}) failed: {what}; the other ranks were stopped"
           + (f"\nother ranks:{tail}" if tail else "")
           + (f"\n{who}'s traceback:\n{first['traceback']}" if first["traceback"] else ""))
    rank = silent[0] if first["kind"] == "collective" and len(silent) == 1 else first["rank"]
    return TensorParallelError(msg, rank, failures)


def _short(text: str, n: int = 200) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= n else line[:n] + " ..."


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)


def run_ranks(fn, tp: int, args=(), **kw) -> list:
    """`launch(fn, tp, args, **kw)`, or under torchrun this process's rank only: a list of tp
    entries with this rank's result in its place and None elsewhere."""
    if not in_torchrun():
        return launch(fn, tp, args, **kw)
    world = int(os.environ["WORLD_SIZE"])
    if world != tp:
        raise ValueError(f"tp={tp} but torchrun started {world} ranks (--nproc-per-node); give the same number")
    device = kw.get("device", "cpu")
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    dev = torch.device("cuda", local) if torch.device(device).type == "cuda" else torch.device("cpu")
    owned = not torch.distributed.is_initialized()
    group = TPGroup.from_env(dev, kw.get("backend"), kw.get("timeout_s", DEFAULT_TIMEOUT_S))
    kw.pop("interruptible", None)    # torchrun delivers Ctrl-C to every rank itself
    out = [None] * tp
    out[group.rank] = fn(group, *args)
    if owned:
        torch.distributed.destroy_process_group()
    return out
