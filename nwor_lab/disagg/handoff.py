"""The two halves of a hand-off, and the two-process run.

    prefill(engine, prompts, max_new_tokens, strategy) -> list[Shipment]
        one step of the prefill engine over every prompt (target, head, a hybrid's state), then
        each request exported and aborted there (its blocks freed)
    decode(engine, shipments) -> list[list[int]]
        every shipment installed on the decode engine, which runs to the end
    handoff(prefill_engine, decode_engine, prompts, ..., transport=InProcess()) -> HandoffResult
        both in this process, every frame through `transport`
    EnginePair                   how each rank builds its engine (picklable)
    (two processes: nwor_lab.disagg.ranks, run_handoff / run_ipc_handoff / run_rounds)

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
from nwor_lab.disagg.transport import InProcess
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

    def models(self, device="cpu") -> tuple:
        """-> (target, head) on `device` (both ranks draw the same weights: the seeds are the pair's)."""
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
        return target.to(device), head.to(device)

    def fresh(self, models: tuple) -> SpecEngine:
        """A fresh engine on `models` (from `models()`): a repeat builds a new engine, not new weights."""
        kw = dict(self.engine)
        if self.acceptance:
            from nwor_lab.speculative.synthetic import ForcedAcceptance
            kw["acceptance"] = ForcedAcceptance.parse(self.acceptance, kw.get("k", 0))
        return SpecEngine(*models, self.config, **kw)

    def build(self, device="cpu") -> SpecEngine:
        return self.fresh(self.models(device))
