"""The hand-off between two processes (nwor_lab.distributed.launch): rank 0 prefills and sends, rank 1
receives and decodes.

    run_handoff(pair, prompts, max_new_tokens, strategy, transport="gloo") -> HandoffResult
    run_ipc_handoff(pair, prompts, max_new_tokens, strategy, device="cuda:0") -> HandoffResult
    run_rounds(pair, prompts, max_new_tokens, schedule, transport=...) -> one row per schedule item

Where each rank runs is the transport's:

    gloo      both ranks on the CPU; the rows go through the frame's messages on the CPU
    nccl      rank r on cuda:r (prefill on cuda:0, decode on cuda:1), each engine built there; the
              prefill rank exports its rows on its GPU (`on_device`), `TorchDistributed` sends them
              GPU to GPU and the decode rank installs them from its own GPU
    cuda_ipc  both ranks on one GPU (`device`), a gloo group on the CPU for control (nwor_lab.disagg.ipc)

`run_rounds` keeps both processes (and each rank's weights) for a whole `schedule`: each item is a
hand-off strategy's name, or `ONE_ENGINE` (rank 1 runs the prompts on one engine of its own, the
reference, while rank 0 waits). Every item builds fresh engines on the same weights, and both ranks
meet at a barrier after it, so the rounds never overlap (on one card they would share it) and a
schedule can interleave strategies and the reference with warm-up rounds first (bench disagg's
repeats). Times are taken after a device synchronise on both sides of each span.

The protocol ships, then decodes: rank 1 receives every shipment of a round before its decode engine
runs, so no transfer overlaps a decode step by construction. `profile_round` / `profile_to` record
rank 1's receive and decode of one round under torch.profiler (ranges `handoff.recv`,
`handoff.decode`) as a Chrome trace at `profile_to`, which shows it on the device's timeline
(nwor_lab.bench.trace_profile reads it). Under NCCL this is unverified here (no GPU on the machine it
was written on): tests/gpu/test_gpu_handoff_nccl.py and tests/gpu/today_run.sh nccl run it.
"""
from __future__ import annotations

import contextlib
import gc
import time

import torch

from nwor_lab.disagg.handoff import EnginePair, HandoffResult, _result, decode, handoff, prefill
from nwor_lab.disagg.strategies import handoff_strategy
from nwor_lab.disagg.transport import TorchDistributed, check_transport

ONE_ENGINE = "one engine"


def _rank_device(group, transport: str, ipc_device: str) -> torch.device:
    if transport != "cuda_ipc":
        return group.device          # gloo: the CPU; nccl: cuda:rank (TPGroup.init set it current)
    device = torch.device(ipc_device)
    torch.cuda.set_device(device)
    return device


def _link(group, transport: str):
    if transport == "cuda_ipc":
        from nwor_lab.disagg.ipc import CudaIpc
        return CudaIpc(group, peer=1 - group.rank)
    return TorchDistributed(group, peer=1 - group.rank)


def _profiled(path: str | None):
    """torch.profiler (CPU and, on CUDA, device activity) writing a Chrome trace to `path` at exit."""
    if path is None:
        return contextlib.nullcontext()
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    @contextlib.contextmanager
    def run():
        with profile(activities=acts) as prof:
            yield
        prof.export_chrome_trace(path)
    return run()


def _mark(name: str, on: bool):
    if not on:
        return contextlib.nullcontext()
    from torch.profiler import record_function
    return record_function(name)


def _send_round(engine, link, group, prompts, max_new_tokens, strategy, device, sync) -> dict:
    sync()
    t0 = time.perf_counter()
    shipped = prefill(engine, prompts, max_new_tokens, strategy, on_device=device.type == "cuda")
    sync()
    t1 = time.perf_counter()
    group.broadcast_(torch.tensor([len(shipped)], dtype=torch.long, device=group.device), src=0)
    before = getattr(link, "control_bytes", 0)
    for s in shipped:
        link.send(s)
    sync()            # NCCL: the sends are enqueued; they are done once the decode rank has the bytes
    out = {"prefill_s": t1 - t0, "send_s": time.perf_counter() - t1}
    if hasattr(link, "control_bytes"):
        out["control_bytes"] = link.control_bytes - before
    return out


def _recv_round(engine, link, group, max_new_tokens, strategy, sampler_stream, sync, trace) -> HandoffResult:
    n = torch.zeros(1, dtype=torch.long, device=group.device)
    group.broadcast_(n, src=0)
    with _profiled(trace):
        sync()
        t1 = time.perf_counter()
        with _mark("handoff.recv", trace is not None):
            received = [link.recv() for _ in range(int(n))]
            sync()
        t2 = time.perf_counter()
        with _mark("handoff.decode", trace is not None):
            tokens = decode(engine, received, sampler_stream=sampler_stream)
            sync()
        t3 = time.perf_counter()
    res = _result(strategy, link.name, received, tokens, engine, (0.0, t2 - t1, t3 - t2))
    res.extra["rows_device"] = next((str(t.device) for s in received for name, t in s.tensors.items()
                                     if name.startswith("key.")), None)
    return res


def one_engine_round(engine, prompts, max_new_tokens, sync) -> dict:
    """Run `prompts` on one engine (the reference a hand-off is measured against) -> token ids, the
    first step's seconds (prefill), the rest's (decode) and the mean acceptance length; `sync` waits for the device."""
    from nwor_lab.engine.generate import acceptance_stats
    reqs = [engine.add_request(p, max_new_tokens) for p in prompts]
    sync()
    t0 = time.perf_counter()
    engine.step_with_progress()
    sync()
    t1 = time.perf_counter()
    engine.run()
    sync()
    t2 = time.perf_counter()
    mean = acceptance_stats(engine.trace, engine.k)[0] if engine.k else 1.0
    return {"strategy": ONE_ENGINE, "token_ids": [r.output for r in reqs], "prefill_s": t1 - t0,
            "decode_s": t2 - t1, "mean_acceptance_length": mean}


def _rounds_rank(group, pair: EnginePair, transport: str, ipc_device: str, prompts, max_new_tokens, schedule,
                 sampler_stream: bool, profile_round: int | None, profile_to: str | None) -> list:
    """One rank's side of every round of `schedule` (nwor_lab.distributed.launch's fn)."""
    device = _rank_device(group, transport, ipc_device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)  # noqa: E731
    link = _link(group, transport)
    models = pair.models(device)
    out = []
    for i, item in enumerate(schedule):
        if group.rank == 0:
            out.append(None if item == ONE_ENGINE else
                       _send_round(pair.fresh(models), link, group, prompts, max_new_tokens, item, device, sync))
        elif item == ONE_ENGINE:
            out.append(one_engine_round(pair.fresh(models), prompts, max_new_tokens, sync))
        else:
            out.append(_recv_round(pair.fresh(models), link, group, max_new_tokens, item, sampler_stream, sync,
                                   profile_to if i == profile_round else None))
        gc.collect()               # the round's engine (reference cycles) and its cache go before the next
        group.barrier()            # both ranks start the next round together
    return out


def run_rounds(pair: EnginePair, prompts, max_new_tokens: int, schedule, *, transport: str = "gloo",
               device: str = "cuda:0", sampler_stream: bool = True, timeout_s: float = 60.0,
               profile_round: int | None = None, profile_to: str | None = None) -> list:
    """Every item of `schedule` (a strategy name or ONE_ENGINE) between the same two processes over
    `transport` ("gloo", "nccl", "cuda_ipc" on `device`) -> per item: a HandoffResult (rank 1's, with
    rank 0's prefill time, `extra["send_s"]` and, for cuda_ipc, `extra["control_bytes"]`) or, for
    ONE_ENGINE, a dict (token_ids, prefill_s, decode_s, mean_acceptance_length). `timeout_s`: the
    collective timeout, which must exceed the longest round (a rank waits at the barrier meanwhile)."""
    from nwor_lab.distributed.launcher import launch
    check_transport(transport)
    if transport == "inprocess":
        raise ValueError("run_rounds: transport='inprocess' runs in this process; use handoff() or run_handoff()")
    if transport == "cuda_ipc" and (torch.device(device).type != "cuda" or not torch.cuda.is_available()):
        raise ValueError(f"transport='cuda_ipc' on device={device!r}: CUDA IPC shares GPU memory between "
                         f"processes and needs a CUDA device; use transport='gloo' on the CPU")
    if transport == "nccl" and torch.cuda.device_count() < 2:
        raise ValueError(f"transport='nccl': the prefill and decode engines need a GPU each (cuda:0, cuda:1), "
                         f"{torch.cuda.device_count()} visible; on one GPU use transport='cuda_ipc', on the CPU 'gloo'")
    schedule = [s if s == ONE_ENGINE else handoff_strategy(s).name for s in schedule]
    where = "cuda" if transport == "nccl" else "cpu"
    backend = "gloo" if transport == "cuda_ipc" else transport
    sent, got = launch(_rounds_rank, 2, (pair, transport, device, prompts, max_new_tokens, schedule, sampler_stream,
                                         profile_round, profile_to),
                       device=where, backend=backend, timeout_s=timeout_s, threads=1)
    for s, res in zip(sent, got):
        if isinstance(res, HandoffResult):
            res.prefill_s = s["prefill_s"]
            res.extra.update({k: v for k, v in s.items() if k != "prefill_s"})
    return got


def run_handoff(pair: EnginePair, prompts, max_new_tokens: int, strategy="nwor", *, transport: str = "gloo",
                sampler_stream: bool = True, timeout_s: float = 60.0) -> HandoffResult:
    """The hand-off between two processes over `transport` ("gloo" on CPU; "nccl": prefill on cuda:0,
    decode on cuda:1; "cuda_ipc": both on cuda:0; "inprocess": both engines in this process)
    -> the decode rank's result, with the prefill time."""
    check_transport(transport)
    if transport == "cuda_ipc":
        return run_ipc_handoff(pair, prompts, max_new_tokens, strategy, sampler_stream=sampler_stream,
                               timeout_s=max(timeout_s, 300.0))
    if transport == "inprocess":
        return handoff(pair.build(), pair.build(), prompts, max_new_tokens, strategy, sampler_stream=sampler_stream)
    return run_rounds(pair, prompts, max_new_tokens, [strategy], transport=transport,
                      sampler_stream=sampler_stream, timeout_s=timeout_s)[0]


def run_ipc_handoff(pair, prompts, max_new_tokens: int, strategy="nwor", *, device: str = "cuda:0",
                    sampler_stream: bool = True, timeout_s: float = 300.0):
    """The hand-off between two processes sharing one GPU (`device`) through CUDA IPC. -> the decode
    rank's HandoffResult, with the prefill time and the control channel's bytes in `extra`."""
    return run_rounds(pair, prompts, max_new_tokens, [strategy], transport="cuda_ipc", device=device,
                      sampler_stream=sampler_stream, timeout_s=timeout_s)[0]
