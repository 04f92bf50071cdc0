"""`generate(prompts, ...)`: run the engine to completion and summarise acceptance.

`prepare(...)` takes the same arguments and returns a `Generation`: the engine with every prompt
queued, to be stepped one verify window at a time (streaming front ends, Ctrl-C) and summarised
at any point with `result()`. `generate(...)` is `prepare(...).run().result()`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from nwor_lab._checks import check_device
from nwor_lab.config import LabConfig, check_int, check_temperature
from nwor_lab.engine.choices import Choices
from nwor_lab.engine.tree_plan import tree_plan
from nwor_lab.engine.engine import SpecEngine
from nwor_lab.engine.preemption import Preemption, check_preemption
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.engine.ring import sliding_window_for
from nwor_lab.engine.request import Request, check_prompt, fit_context
from nwor_lab.engine.trace import WindowTrace


@dataclass
class GenerationRecord:
    """What a run reports, whoever ran it (one engine here, tensor-parallel ranks in
    `distributed.generate`): texts / token_ids per prompt (generated part only); trace: every
    window in order.

    mean_acceptance_length: tokens emitted per target forward of a speculative request: the
    mean, over (request, verify window) pairs that had drafts, of the tokens that window appended
    to the request's output (accepted drafts + the target's own token, as emitted: tokens past
    max_new_tokens or an end token were never emitted and do not count). At most k + 1.
    acceptance_by_position[j]: fraction of drafts d_{j+1} accepted, over the windows where d_{j+1}
    could still be emitted (a window cut at its e-th token counts positions 1..e only).
    """

    token_ids: list[list[int]]
    texts: list[str] | None
    trace: list[WindowTrace]
    mean_acceptance_length: float
    acceptance_by_position: list[float]
    target_forwards: int

    def summary(self) -> dict:
        return {"mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_by_position": self.acceptance_by_position,
                "target_forwards": self.target_forwards,
                "tokens": sum(len(t) for t in self.token_ids)}


@dataclass
class GenerationResult(GenerationRecord):
    """A `GenerationRecord` of one engine, with the engine itself and what its summary adds."""

    engine: SpecEngine = field(repr=False)
    complete: bool = True          # False: taken before every request finished (e.g. interrupted)
    kv: dict = field(default_factory=dict)   # the strategy and the KV memory per request (`kv_summary`)
    blocks: dict = field(default_factory=dict)   # prefix caching and preemption (`block_summary`)

    def summary(self) -> dict:
        return {**super().summary(), "complete": self.complete, **self.kv, **self.blocks}


def block_summary(engine: SpecEngine) -> dict:
    """Blocks that outlive a request: `prefix_cache` (the engine's `prefix_stats()`: hit tokens, hit
    rate, strategies...; None when prefix caching is off) and `preemption` (its mode and
    `preemption_stats`: preemptions, recomputed tokens, swapped bytes, aborts)."""
    return {"prefix_cache": engine.prefix_stats(),
            "preemption": {"mode": engine.preemption.mode, **engine.preemption_stats.as_dict()}}


def kv_summary(engine: SpecEngine, requests: list[Request]) -> dict:
    """The engine's strategy (write policy + sliding-window cache) and what one request holds:
    `kv_slots_per_request` (positions kept per layer), the bytes kept for its life and the bytes
    the policy holds while a window is open, for the longest request; `state_mode`: a hybrid
    target's state strategy (None without recurrent state)."""
    from nwor_lab.engine.ring import kv_memory, resolve_kv_ring
    cls = type(engine.policy)
    sw = engine.sliding
    longest = max((len(r.prompt) + r.max_new_tokens + engine.k for r in requests), default=0)
    mem = kv_memory(engine.cache.spec, sw, cls, engine.k, longest)
    return {"strategy": engine.strategy, "sliding_window": sw.size if sw else 0,
            "kv_ring": resolve_kv_ring(engine.config, cls) if sw else None,
            "ring_slots": sw.ring_slots if sw else None, "kv_slots_per_request": mem.slots,
            "kv_memory_per_request": mem.as_dict(), "cuda_graph_off": engine.graphed_off,
            "state_mode": engine.states.name if engine.states is not None else None}


def acceptance_stats(trace: list[WindowTrace], k: int) -> tuple[float, list[float]]:
    """(mean acceptance length, acceptance by position) as `GenerationResult` defines them,
    counting what was emitted: every request drafts k to its last window, and the tokens verified
    past its end are cut, so `accepted + 1` would count tokens nobody received."""
    produced, windows = 0, 0
    drafted_at, accepted_at = [0] * k, [0] * k
    for w in trace:
        if w.kind != "verify":
            continue
        for n, a, out in zip(w.drafted, w.accepted, w.emitted):
            if n:
                e = len(out)
                produced += e
                windows += 1
                # cut (e <= a): the e emitted tokens are d_1..d_e, all accepted; else all n positions count
                counted, kept = (e, e) if e <= a else (n, a)
                for j in range(min(counted, k)):
                    drafted_at[j] += 1
                    accepted_at[j] += int(j < kept)
    mean = produced / windows if windows else 1.0
    return mean, [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)]


class Generation:
    """A `generate` in progress: `engine` with `requests` (one per prompt, in order) queued.

    `step()` runs one verify window (and its drafting); `run()` steps to the end; `result()`
    summarises what was generated so far, at any point (`complete` says whether it is all).
    Text as it is produced: `requests[i].output` after each step, or an engine observer's
    `on_window_end(engine, trace, window)`.
    """

    def __init__(self, engine: SpecEngine, requests: list[Request], tokenizer, k: int):
        self.engine, self.requests, self.tokenizer, self.k = engine, requests, tokenizer, k

    @property
    def done(self) -> bool:
        return not self.engine.scheduler.has_work

    def step(self) -> bool:
        """One engine step; False once there is nothing left to do."""
        if self.done:
            return False
        self.engine.step_with_progress()
        return True

    def run(self) -> "Generation":
        self.engine.run()
        return self

    def result(self) -> GenerationResult:
        out = [list(r.output) for r in self.requests]
        texts = [self.tokenizer.decode(o) for o in out] if self.tokenizer is not None else None
        mean, by_pos = acceptance_stats(self.engine.trace, max(self.k, 1))
        return GenerationResult(out, texts, list(self.engine.trace), mean, by_pos, self.engine.target_forwards,
                                self.engine, complete=self.done, kv=kv_summary(self.engine, self.requests),
                                blocks=block_summary(self.engine))


def check_window_limits(k: int, max_new_tokens: int, max_model_len: int) -> None:
    """The limits that hold whatever the prompts are (checked before the cache is sized or, for
    tensor parallelism, before a rank starts): a window of t_last + k drafts fits the model's
    positions (a huge k would otherwise size the cache for it, and be blamed on num_blocks), and
    so do max_new_tokens after a one-token prompt. (A window larger than max_num_batched_tokens
    is fine: its drafts are cut to the budget, and a longer prompt is prefilled in chunks.)"""
    if k >= max_model_len:
        raise ValueError(f"k={k}: a verify window of 1 + k tokens needs as many positions; the model has "
                         f"{max_model_len}; lower k")
    fit_context("prompt", [0], max_new_tokens, max_model_len)


def prepare(prompts, max_new_tokens: int = 32, k: int = 4, config: LabConfig | None = None, *,
            target=None, head=None, tokenizer=None, temperature: float = 0.0, seed: int = 0,
            num_blocks: int | None = None, block_size: int = 16, max_num_seqs: int = 8,
            max_num_batched_tokens: int = 1024, device="cpu", dtype=torch.float32,
            stop_at_eos: bool = False, cache_dtype: str = "auto", observers=(),
            truncate_prompts: bool = False, max_cache_memory: int | None = None,
            acceptance=None, prefix_cache: PrefixCacheConfig | None = None,
            preemption: Preemption | None = None) -> Generation:
    """`generate`'s set-up: every argument checked (before the shipped model is loaded and before
    the cache is allocated), the engine built, every prompt queued. The arguments are documented at
    `generate`, which takes these very ones."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts: expected a list of prompts (each a str or a list of token ids), got "
                        f"{type(prompts).__name__}; for one prompt pass [prompt]")
    if not prompts:
        raise ValueError("prompts: the list is empty; give at least one prompt")
    choices = Choices.of(config)        # checked once, handed to the engine
    config = choices.config
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    k = check_int("k", k, 0)
    check_temperature("temperature", temperature)
    check_int("block_size", block_size, 1)
    if num_blocks is not None:
        check_int("num_blocks", num_blocks, 1)
    max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
    check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
    check_int("seed", seed, 0)
    check_preemption(preemption)
    if prefix_cache is not None and not isinstance(prefix_cache, PrefixCacheConfig):
        raise TypeError(f"prefix_cache: expected a PrefixCacheConfig (nwor_lab.engine.prefix) or None, got "
                        f"{type(prefix_cache).__name__}")
    if target is None:
        from nwor_lab.model.shipped import load_tiny
        target, shipped_head, shipped_tok = load_tiny(device=check_device("device", device), dtype=dtype)
        head = shipped_head if head is None else head
        tokenizer = shipped_tok if tokenizer is None else tokenizer
    limit, vocab = target.config.max_position_embeddings, target.config.vocab_size
    check_window_limits(k, max_new_tokens, limit)
    ids = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("prompts: text prompts need a tokenizer (or pass token id lists)")
            try:
                p.encode("utf-8")
            except UnicodeEncodeError as err:   # bytes that are not UTF-8 arrive as lone surrogates
                raise ValueError(f"prompts[{i}]: not valid UTF-8 text (character {err.start} is a lone "
                                 f"surrogate, e.g. a byte read with errors='surrogateescape'); pass text") from None
            p = tokenizer.encode(p).ids
        ids.append(fit_context(f"prompts[{i}]", check_prompt(f"prompts[{i}]", p, vocab), max_new_tokens,
                               limit, truncate_prompts))
    shape = config.tree_shape if k > 0 else None
    if num_blocks is None:
        # a tree writes past t_last what its plan's lookahead says (the window's N nodes, the head's draft window)
        ahead = tree_plan(shape).lookahead if shape is not None else k
        per = -(-(max(len(p) for p in ids) + max_new_tokens + ahead) // block_size)
        sliding = sliding_window_for(config, k if head is not None else 0, choices.policy)
        if sliding is not None and sliding.ring_slots is not None:   # a ring: ceil(S / BS) blocks at most
            per = min(per, -(-sliding.ring_slots // block_size))
        num_blocks = per * min(len(ids), max_num_seqs) + 1
    eos = target.config.eos_token_id if stop_at_eos else None
    engine = SpecEngine(target, head if k > 0 else None, choices, k=k, num_blocks=num_blocks,
                        block_size=block_size, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, temperature=temperature, seed=seed,
                        eos_token_id=eos, cache_dtype=cache_dtype, max_cache_memory=max_cache_memory,
                        acceptance=acceptance, prefix_cache=prefix_cache, preemption=preemption)
    engine.observers.extend(observers)
    reqs = [engine.add_request(p, max_new_tokens, name=f"prompts[{i}]") for i, p in enumerate(ids)]
    # with trees, acceptance by position is by depth (the accepted path's nodes)
    return Generation(engine, reqs, tokenizer, engine.tree_plan.depth if engine.tree is not None else k)


def generate(prompts, *args, **kwargs) -> GenerationResult:
    """Generate for every prompt (a list: each a str with a tokenizer, or a list of token ids) with
    EAGLE drafts.

    Arguments and defaults are `prepare`'s (one signature: `inspect.signature(generate)` shows it).
    target/head/tokenizer default to the shipped tiny pair; k=0 (or head=None with a custom
    target) runs target-only decoding. `config` picks the NWOR and SCV modes; `cache_dtype`
    `auto` / `fp8_e4m3` / `fp8_e5m2` the cache storage (fp8 scales 1.0 unless set on the engine).
    Limits, all checked before anything is allocated: prompt + max_new_tokens within the model's
    max_position_embeddings (`truncate_prompts` keeps each prompt's last tokens that fit instead
    of raising), token ids in its vocabulary, counts >= 1 (k >= 0), a finite temperature >= 0,
    and the cache's size within `max_cache_memory` bytes (if given) and the device's free memory.
    `acceptance`: a `ForcedAcceptance` (benchmarks): drafts accepted by its profile, not by the
    target (nwor_lab.speculative.synthetic); the tokens are then not the target's.
    `prefix_cache`: a `PrefixCacheConfig` (nwor_lab.engine.prefix) shares committed blocks across
    requests (None: off); `preemption`: a `Preemption` ("recompute", the default, or "swap") for when
    the cache runs out (nwor_lab.engine.preemption); the result's `summary()` reports both
    (`block_summary`). A prompt longer than `max_num_batched_tokens` is prefilled in chunks.
    """
    return prepare(prompts, *args, **kwargs).run().result()


generate.__signature__ = inspect.signature(prepare).replace(return_annotation="GenerationResult")
