"""What the clients send: request specs from fixed-seed length distributions, and arrival times.

Lengths follow vLLM's random dataset (`--random-input-len`, `--random-output-len`,
`--random-range-ratio` r): uniform integers in [L (1 - r), L (1 + r)], at least 1. Open-loop
arrivals are a Poisson process at `rate` requests per second of wall-clock time (exponential gaps,
vLLM's `--request-rate` with burstiness 1), fixed by the seed: every config of a sweep sees the
same requests at the same offsets.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestSpec:
    prompt: list[int]
    output_len: int


def sample_lengths(n: int, mean: int, range_ratio: float, seed: int) -> list[int]:
    """n lengths, uniform integers in [mean (1 - r), mean (1 + r)] (at least 1), fixed by seed."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio={range_ratio}: must be in [0, 1) (lengths are mean x (1 +- r))")
    lo, hi = max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))
    return np.random.default_rng(seed).integers(lo, hi + 1, n).tolist()


def specs_from_stream(stream: np.ndarray, n: int, prompt_len: int, output_len: int, range_ratio: float,
                      seed: int = 0) -> list[RequestSpec]:
    """Real prompts: n slices of a token stream (the held-out corpus) at seeded offsets."""
    plens = sample_lengths(n, prompt_len, range_ratio, seed)
    olens = sample_lengths(n, output_len, range_ratio, seed + 1)
    if max(plens) >= stream.size:
        raise ValueError(f"prompt length {max(plens)} exceeds the token stream ({stream.size} tokens)")
    gen = np.random.default_rng(seed + 2)
    starts = [int(gen.integers(0, stream.size - p)) for p in plens]
    return [RequestSpec(stream[s:s + p].astype(np.int64).tolist(), o) for s, p, o in zip(starts, plens, olens)]


def random_specs(n: int, prompt_len: int, output_len: int, range_ratio: float, vocab: int,
                 seed: int = 0) -> list[RequestSpec]:
    """Random token ids (a model with random weights: the ids mean nothing, the lengths do)."""
    plens = sample_lengths(n, prompt_len, range_ratio, seed)
    olens = sample_lengths(n, output_len, range_ratio, seed + 1)
    gen = np.random.default_rng(seed + 2)
    return [RequestSpec(gen.integers(0, vocab, p).tolist(), o) for p, o in zip(plens, olens)]


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival offsets in seconds `[n]`, non-decreasing, the first at 0: a Poisson process of `rate`
    requests per second (rate = inf: every request at 0, vLLM's default)."""
    if not rate > 0:
        raise ValueError(f"rate={rate}: requests per second must be > 0 (inf: all at once)")
    if np.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()
