"""The two halves of a hand-off, and the two-process run.

    prefill(engine, prompts, max_new_tokens, strategy) -> list[Shipment]
        one step of the prefill engine over every prompt (target, head, a hybrid's state), then
        each request exported and aborted there (its blocks freed)
    decode(engine, shipments) -> list[list[int]]
        every shipment installed on the decode engine, which runs to the end
    handoff(prefill_engine, decode_engine, prompts, ..., transport=InProcess()) -> HandoffResult
        both in this process, every frame through `transport`
    run_handoff(pair, prompts, ..., transport="gloo") -> HandoffResult
        two processes (nwor_lab.distributed.launch): rank 0 prefills and sends, rank 1 receives and
        decodes; `pair` is an `EnginePair` (picklable: each rank builds its own engine)

The prompts of one hand-off are prefilled in one step, as one engine would prefill them in its
first step: the decode engine then runs the batch one engine would run, and at T > 0 draws from
the same random stream (the engine has one generator for the batch; the frame carries its state).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from nwor_lab.config import LabConfig
from nwor_lab.disagg.observer import RejectedRows
from nwor_lab.disagg.shipment import Shipment, check_exportable, export_request, install
from nwor_lab.disagg.strategies import handoff_strategy
from nwor_lab.disagg.transport import InProcess, TorchDistributed, check_transport
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.generate import acceptance_stats


def watch_rejected(engine) -> RejectedRows:
    """The engine's RejectedRows observer (attached on first call)."""
    for o in engine.observers:
        if isinstance(o, RejectedRows):
            return o
    o = RejectedRows()
    engine.observers.append(o)
    return o


def prefill(engine, prompts: list[list[int]], max_new_tokens: int, strategy="nwor", *,
            on_device: bool = False) -> list[Shipment]:
    """Prefill every prompt in one step of `engine`; -> one shipment per prompt, in order
    (`on_device`: K/V rows and state left on the engine's device, for CUDA IPC)."""
    strategy = handoff_strategy(strategy)
    check_exportable(engine)              # before anything runs: a refused engine is left as it was
    rejected = watch_rejected(engine)
    if engine.scheduler.has_work:
        raise ValueError("prefill: the prefill engine has requests of its own queued; give it only the hand-off's")
    reqs = [engine.add_request(p, max_new_tokens, name=f"prompts[{i}]") for i, p in enumerate(prompts)]
    engine.step_with_progress()
    late = [i for i, r in enumerate(reqs) if r.is_prefill and not r.finished]
    if late:
        for r in reqs:
            engine.abort(r.req_id)
        raise ValueError(f"prefill: prompts {late} did not fit the first step (max_num_seqs="
                         f"{engine.scheduler.max_num_seqs}, max_num_batched_tokens="
                         f"{engine.scheduler.max_num_batched_tokens}); raise them or hand off fewer prompts")
    out = [export_request(engine, r, strategy, rejected.slots, on_device=on_device) for r in reqs]
    for r in reqs:
        if not r.finished:
            engine.abort(r.req_id)
    return out


def decode(engine, shipments: list[Shipment], *, sampler_stream: bool = True) -> list[list[int]]:
    """Install every shipment on `engine` and run it to the end -> each request's output tokens."""
    reqs = [install(engine, s, sampler_stream=sampler_stream) for s in shipments]
    engine.run()
    return [list(s.header["output"]) if r is None else list(r.output) for s, r in zip(shipments, reqs)]


@dataclass
class HandoffResult:
    token_ids: list[list[int]]
    strategy: str
    transport: str
    kv_bytes: list[int]                   # per request: K/V rows (and state) shipped
    frame_bytes: list[int]                # per request: the whole frame
    junk_rows: list[int]                  # per request: rows shipped past num_computed
    rejected_rows_shipped: list[list]     # per request: shipped rows holding a rejected row (position, block, layers)
    mean_acceptance_length: float         # the decode engine's verify windows
    acceptance_by_position: list[float]
    prefill_s: float = 0.0                # the prefill step (time to the first token)
    transfer_s: float = 0.0               # encode, send, receive, decode
    decode_s: float = 0.0                 # the decode engine's run
    decode_windows: int = 0
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"strategy": self.strategy, "transport": self.transport,
                "kv_bytes": sum(self.kv_bytes), "frame_bytes": sum(self.frame_bytes),
                "junk_rows": sum(self.junk_rows),
                "rejected_rows_shipped": sum(len(x) for x in self.rejected_rows_shipped),
                "mean_acceptance_length": self.mean_acceptance_length,
                "prefill_s": self.prefill_s, "transfer_s": self.transfer_s, "decode_s": self.decode_s}


def _result(strategy, transport, shipments, tokens, engine, times) -> HandoffResult:
    mean, by_pos = acceptance_stats(engine.trace, engine.k) if engine.k else (1.0, [])
    return HandoffResult(tokens, handoff_strategy(strategy).name, transport,
                         [s.kv_bytes for s in shipments], [s.nbytes for s in shipments],
                         [s.header["junk_rows"] for s in shipments],
                         [s.header["rejected_rows_shipped"] for s in shipments], mean, by_pos, *times,
                         decode_windows=sum(1 for w in engine.trace if w.kind == "verify"))


def handoff(prefill_engine, decode_engine, prompts, max_new_tokens: int, strategy="nwor", *,
            transport=None, sampler_stream: bool = True) -> HandoffResult:
    """Both halves in this process, every frame through `transport` (default: InProcess())."""
    transport = transport or InProcess()
    t0 = time.perf_counter()
    shipped = prefill(prefill_engine, prompts, max_new_tokens, strategy)
    t1 = time.perf_counter()
    for s in shipped:
        transport.send(s)
    received = [transport.recv() for _ in shipped]
    t2 = time.perf_counter()
    tokens = decode(decode_engine, received, sampler_stream=sampler_stream)
    t3 = time.perf_counter()
    return _result(strategy, transport.name, received, tokens, decode_engine, (t1 - t0, t2 - t1, t3 - t2))


@dataclass(frozen=True)
class EnginePair:
    """How each rank builds its engine (picklable): `model` "toy" (nwor_lab.model.toy.toy_pair(seed)),
    "tiny" (the shipped pair, nwor_lab.model.shipped.load_tiny), "hybrid" (the shipped hybrid), or
    a random-weight shape "8b" / "8b-mini" (nwor_lab.model.shapes: `head` eagle1 / eagle3, bf16 on
    CUDA, float32 on the CPU; both ranks draw the same weights from `seed`), `config` a LabConfig,
    `engine` the SpecEngine keyword arguments (k, num_blocks, block_size, temperature, seed, ...),
    `acceptance` a forced acceptance profile (`ForcedAcceptance.parse` text; random weights accept
    nothing on their own), "" for none."""

    model: str = "toy"
    seed: int = 0
    config: LabConfig = LabConfig()
    engine: tuple = ()                    # (name, value) pairs: a frozen dataclass holds no dict
    head: str = "eagle3"
    acceptance: str = ""

    def build(self, device="cpu") -> SpecEngine:
        if self.model == "toy":
            from nwor_lab.model.toy import toy_pair
            target, head = toy_pair(self.seed)
        elif self.model == "tiny":
            from nwor_lab.model.shipped import load_tiny
            target, head, _ = load_tiny(device=device)
        elif self.model == "hybrid":
            from nwor_lab.model.shipped import load_hybrid
            target, head, _ = load_hybrid(device=device)
        elif self.model in ("8b", "8b-mini"):
            from nwor_lab.model.shapes import random_head, random_target
            dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
            target = random_target(self.model, device, dtype, seed=self.seed)
            head = random_head(target, self.head, self.model, seed=self.seed + 1)
        else:
            raise ValueError(f"EnginePair(model={self.model!r}): choose toy, tiny, hybrid, 8b or 8b-mini")
        kw = dict(self.engine)
        if self.acceptance:
            from nwor_lab.speculative.synthetic import ForcedAcceptance
            kw["acceptance"] = ForcedAcceptance.parse(self.acceptance, kw.get("k", 0))
        return SpecEngine(target.to(device), head.to(device), self.config, **kw)


def _rank(group, pair: EnginePair, prompts, max_new_tokens, strategy, sampler_stream):
    """Rank 0 prefills and sends, rank 1 receives and decodes (nwor_lab.distributed.launch's fn)."""
    engine = pair.build(group.device)
    link = TorchDistributed(group, peer=1 - group.rank)
    if group.rank == 0:
        t0 = time.perf_counter()
        shipped = prefill(engine, prompts, max_new_tokens, strategy)
        t1 = time.perf_counter()
        group.broadcast_(torch.tensor([len(shipped)], dtype=torch.long, device=group.device), src=0)
        for s in shipped:
            link.send(s)
        return {"prefill_s": t1 - t0, "send_s": time.perf_counter() - t1}
    n = torch.zeros(1, dtype=torch.long, device=group.device)
    group.broadcast_(n, src=0)
    t1 = time.perf_counter()
    received = [link.recv() for _ in range(int(n))]
    t2 = time.perf_counter()
    tokens = decode(engine, received, sampler_stream=sampler_stream)
    t3 = time.perf_counter()
    return _result(strategy, group.backend, received, tokens, engine, (0.0, t2 - t1, t3 - t2))


def run_handoff(pair: EnginePair, prompts, max_new_tokens: int, strategy="nwor", *, transport: str = "gloo",
                sampler_stream: bool = True, timeout_s: float = 60.0) -> HandoffResult:
    """The hand-off between two processes over `transport` ("gloo" on CPU; "nccl": each rank on its
    own GPU, cuda:0 and cuda:1, not run here; "cuda_ipc": both on cuda:0, nwor_lab.disagg.ipc). -> the decode rank's result, with the prefill time."""
    check_transport(transport)
    if transport == "cuda_ipc":
        return run_ipc_handoff(pair, prompts, max_new_tokens, strategy, sampler_stream=sampler_stream,
                               timeout_s=timeout_s)
    if transport == "inprocess":
        return handoff(pair.build(), pair.build(), prompts, max_new_tokens, strategy, sampler_stream=sampler_stream)
    from nwor_lab.distributed.launcher import launch
    device = "cuda" if transport == "nccl" else "cpu"
    sent, result = launch(_rank, 2, (pair, prompts, max_new_tokens, handoff_strategy(strategy).name, sampler_stream),
                          device=device, backend=transport, timeout_s=timeout_s, threads=1)
    result.prefill_s = sent["prefill_s"]
    result.extra["send_s"] = sent["send_s"]
    return result


def _ipc_rank(group, pair, device: str, prompts, max_new_tokens, strategy, sampler_stream):
    """Rank 0 prefills on `device` and sends by IPC handle; rank 1 receives on the same device and
    decodes (nwor_lab.distributed.launch's fn, the group a gloo group on the CPU)."""
    torch.cuda.set_device(torch.device(device))
    from nwor_lab.disagg.ipc import CudaIpc
    engine = pair.build(device)
    link = CudaIpc(group, peer=1 - group.rank)
    count = torch.zeros(1, dtype=torch.long)
    if group.rank == 0:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        shipped = prefill(engine, prompts, max_new_tokens, strategy, on_device=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        count[0] = len(shipped)
        group.broadcast_(count, src=0)
        for s in shipped:
            link.send(s)
        return {"prefill_s": t1 - t0, "send_s": time.perf_counter() - t1, "control_bytes": link.control_bytes}
    group.broadcast_(count, src=0)
    t1 = time.perf_counter()
    received = [link.recv() for _ in range(int(count))]
    t2 = time.perf_counter()
    tokens = decode(engine, received, sampler_stream=sampler_stream)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    return _result(strategy, "cuda_ipc", received, tokens, engine, (0.0, t2 - t1, t3 - t2))


def run_ipc_handoff(pair, prompts, max_new_tokens: int, strategy="nwor", *, device: str = "cuda:0",
                    sampler_stream: bool = True, timeout_s: float = 300.0):
    """The hand-off between two processes sharing one GPU (`device`) through CUDA IPC. -> the decode
    rank's HandoffResult, with the prefill time and the control channel's bytes in `extra`."""
    from nwor_lab.distributed.launcher import launch
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"transport='cuda_ipc' on device={device!r}: CUDA IPC shares GPU memory between "
                         f"processes and needs a CUDA device; use transport='gloo' on the CPU")
    sent, result = launch(_ipc_rank, 2, (pair, device, prompts, max_new_tokens, handoff_strategy(strategy).name,
                                         sampler_stream),
                          device="cpu", backend="gloo", timeout_s=timeout_s, threads=1)
    result.prefill_s = sent["prefill_s"]
    result.extra.update(send_s=sent["send_s"], control_bytes=sent["control_bytes"])
    return result
