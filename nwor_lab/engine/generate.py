"""`generate(prompts, ...)`: run the engine to completion and summarise acceptance."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine.engine import SpecEngine
from nwor_lab.engine.trace import WindowTrace


@dataclass
class GenerationResult:
    """texts / token_ids per prompt (generated part only); trace: every window in order.

    mean_acceptance_length: tokens produced per target forward of a speculative request, i.e.
    mean of (accepted + 1) over (request, verify window) pairs that had drafts.
    acceptance_by_position[j]: fraction of drafts d_{j+1} that were accepted.
    """

    token_ids: list[list[int]]
    texts: list[str] | None
    trace: list[WindowTrace]
    mean_acceptance_length: float
    acceptance_by_position: list[float]
    target_forwards: int
    engine: SpecEngine = field(repr=False)

    def summary(self) -> dict:
        return {"mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_by_position": self.acceptance_by_position,
                "target_forwards": self.target_forwards,
                "tokens": sum(len(t) for t in self.token_ids)}


def acceptance_stats(trace: list[WindowTrace], k: int) -> tuple[float, list[float]]:
    produced, windows = 0, 0
    drafted_at, accepted_at = [0] * k, [0] * k
    for w in trace:
        if w.kind != "verify":
            continue
        for n, a in zip(w.drafted, w.accepted):
            if n:
                produced += a + 1
                windows += 1
                for j in range(n):
                    drafted_at[j] += 1
                    accepted_at[j] += int(j < a)
    mean = produced / windows if windows else 1.0
    return mean, [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)]


def generate(prompts, max_new_tokens: int = 32, k: int = 4, config: LabConfig | None = None, *,
             target=None, head=None, tokenizer=None, temperature: float = 0.0, seed: int = 0,
             num_blocks: int | None = None, block_size: int = 16, max_num_seqs: int = 8,
             max_num_batched_tokens: int = 1024, device="cpu", dtype=torch.float32,
             stop_at_eos: bool = False, cache_dtype: str = "auto", observers=()) -> GenerationResult:
    """Generate for every prompt (str with a tokenizer, or a list of token ids) with EAGLE drafts.

    target/head/tokenizer default to the shipped tiny pair; k=0 (or head=None with a custom
    target) runs target-only decoding. `config` picks the NWOR and SCV modes; `cache_dtype`
    `auto` / `fp8_e4m3` / `fp8_e5m2` the cache storage (fp8 scales 1.0 unless set on the engine).
    """
    if target is None:
        from nwor_lab.model.shipped import load_tiny
        target, shipped_head, shipped_tok = load_tiny(device=device, dtype=dtype)
        head = shipped_head if head is None else head
        tokenizer = shipped_tok if tokenizer is None else tokenizer
    ids = []
    for p in prompts:
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("prompts: text prompts need a tokenizer (or pass token id lists)")
            p = tokenizer.encode(p).ids
        ids.append(list(p))
    if num_blocks is None:
        per = -(-(max(len(p) for p in ids) + max_new_tokens + k) // block_size)
        num_blocks = per * min(len(ids), max_num_seqs) + 1
    eos = target.config.eos_token_id if stop_at_eos else None
    engine = SpecEngine(target, head if k > 0 else None, config, k=k, num_blocks=num_blocks,
                        block_size=block_size, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, temperature=temperature, seed=seed,
                        eos_token_id=eos, cache_dtype=cache_dtype)
    engine.observers.extend(observers)
    reqs = [engine.add_request(p, max_new_tokens) for p in ids]
    engine.run()
    out = [r.output for r in reqs]
    texts = [tokenizer.decode(o) for o in out] if tokenizer is not None else None
    mean, by_pos = acceptance_stats(engine.trace, max(k, 1))
    return GenerationResult(out, texts, engine.trace, mean, by_pos, engine.target_forwards, engine)
