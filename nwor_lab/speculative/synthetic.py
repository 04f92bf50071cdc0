"""Forced acceptance: drafts accepted by a given per-position profile, not by the target.

A benchmark on a model with random weights has drafts the target never agrees with, yet what it
measures (every kernel, graph and policy at a realistic acceptance) needs drafts accepted at the
rate a trained pair reaches. vLLM 0.32 has the same mode (`SpeculativeConfig.
rejection_sample_method = "synthetic"`), and the lab follows its conventions:

    profile p_j      unconditional: the probability that drafts d_1 .. d_{j+1} are ALL accepted
                     (vLLM's `synthetic_acceptance_rates`: one entry per draft position, each in
                     [0, 1], non-increasing); mean acceptance length = 1 + sum_j p_j
    conditional c_j  p_j / p_{j-1} (p_{-1} = 1; 0 after a zero), what the sampler tests
                     (vLLM's `unconditional_to_conditional_rates`)
    draft j         accepted iff u_j < c_j and it is not padding (id -1), while every draft
                     before it was accepted; the token emitted at the first rejection is the
                     target's own (greedy argmax, or the recovered sample), after all accepted
                     the bonus: exactly vLLM's rejection kernels in synthetic mode

One deliberate difference: vLLM draws u_j from the batch's generator; the lab hashes it from
(seed, the request's key, the draft's position in its sequence; the engine keys a request by a
hash of its prompt), so a draft gets the same verdict in an eager step and a replayed CUDA graph,
in a padded bucket, in every write policy and in every repeat of a benchmark. Greedy ids
stay whatever the target and the drafter emit: the tokens are not meaningful, the work is.

`SHIPPED_PROFILE` is the default: the shipped pair's measured profile. Positions 1-4 are what the
H100 measured for EAGLE-1 in bf16 at k = 4 (`benchmarks/results/engine_h100_bf16.json`, batch 1:
mean acceptance length 3.345, the 3.35 of chapter 11's napkin math); positions 5-6 continue it with
the conditional rates the same pair shows there at k = 6 on CPU (0.881, 0.861;
`benchmarks/results/acceptance_profile_cpu.json`, 32 held-out prompts x 128 tokens, bf16). A
shorter k takes the first k entries (drafts d_1..d_k are the same whatever k is).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# the shipped pair, EAGLE-1, bf16, greedy (see the module docstring): 0.328 x 0.881, then x 0.861
SHIPPED_PROFILE = (0.879, 0.621, 0.517, 0.328, 0.289, 0.2488)
SHIPPED_PROFILE_SOURCE = ("shipped pair, EAGLE-1, bf16: positions 1-4 measured on an H100 (engine_h100_bf16.json, "
                          "batch 1), 5-6 extended by the CPU k = 6 conditional rates (acceptance_profile_cpu.json)")

_M32 = 0xFFFFFFFF


def check_profile(rates, k: int | None = None, name: str = "acceptance") -> tuple[float, ...]:
    """vLLM's rules for `synthetic_acceptance_rates`: floats in [0, 1], non-increasing; with k, at
    least k entries (the first k are used). -> the profile as a tuple (cut to k)."""
    try:
        rates = tuple(float(r) for r in rates)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected numbers in [0, 1], one per draft position, got {rates!r}") from None
    if not rates:
        raise ValueError(f"{name}: empty; give one acceptance rate per draft position")
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"{name}={list(rates)}: every rate must be in [0, 1]")
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"{name}={list(rates)}: per-position rates are unconditional (the chance that drafts "
                         f"1..j are all accepted) and must not increase")
    if k is not None:
        if len(rates) < k:
            raise ValueError(f"{name}={list(rates)}: {len(rates)} positions, but k = {k} drafts need {k}")
        rates = rates[:k]
    return rates


def constant_profile(rate: float, k: int) -> tuple[float, ...]:
    """Every draft accepted with probability `rate` given the ones before it (the textbook alpha):
    unconditional rate^1 .. rate^k."""
    rate = float(rate)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"acceptance rate {rate}: must be in [0, 1]")
    return tuple(rate ** (j + 1) for j in range(k))


def conditional_rates(profile) -> list[float]:
    """Unconditional per-position rates -> conditional ones (vLLM's
    `unconditional_to_conditional_rates`: c_j = p_j / p_{j-1}, 0 after a zero)."""
    profile = list(profile)
    return [p / q if q > 0.0 else 0.0 for p, q in zip(profile, [1.0, *profile[:-1]])]


def mean_acceptance_length(profile) -> float:
    """Expected tokens a window emits: its accepted drafts plus the target's own token."""
    return 1.0 + sum(profile)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An integer hash of int64 values in [0, 2^32) (no product exceeds 2^59: exact on every device)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


def hashed_uniforms(req_keys: torch.Tensor, positions: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """u in [0, 1) float64 per draft from (seed, its request's key, its position in the sequence):
    the same numbers on CPU and CUDA, eager and inside a CUDA graph (plain int64 ops, no RNG)."""
    x = _mix32(torch.full_like(req_keys, (int(seed) * 0x9E3779B9) & _M32, dtype=torch.long))
    x = _mix32(x ^ (req_keys.long() & _M32))
    x = _mix32(x ^ (positions.long() & _M32))
    return x.double() * (1.0 / 4294967296.0)


@dataclass(frozen=True)
class ForcedAcceptance:
    """An engine's opt-in forced acceptance (see the module docstring).

    profile: unconditional per-draft-position rates (at least k entries); seed: mixed into the hash.
    """

    profile: tuple[float, ...] = SHIPPED_PROFILE
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", check_profile(self.profile))

    @classmethod
    def parse(cls, text: str, k: int, seed: int = 0) -> "ForcedAcceptance":
        """`shipped` (the default profile), one number (a constant conditional rate) or a
        comma-separated per-position profile (unconditional, as vLLM's synthetic_acceptance_rates)."""
        text = text.strip()
        if text in ("", "shipped"):
            return cls(SHIPPED_PROFILE, seed)
        parts = [p for p in text.split(",") if p.strip()]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"acceptance={text!r}: expected 'shipped', a rate in [0, 1] or comma-separated "
                             f"per-position rates such as 0.9,0.7,0.5,0.3") from None
        if len(values) == 1:
            return cls(constant_profile(values[0], max(k, 1)), seed)
        return cls(check_profile(values), seed)

    def for_k(self, k: int) -> tuple[float, ...]:
        return check_profile(self.profile, k)

    def conditional(self, k: int, device) -> torch.Tensor:
        """[k] float64 conditional rates on `device` (the sampler's `synthetic_rates`)."""
        return torch.tensor(conditional_rates(self.for_k(k)), dtype=torch.float64, device=device)

    def uniforms(self, req_keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return hashed_uniforms(req_keys, positions, self.seed)

    def describe(self, k: int) -> dict:
        p = self.for_k(k)
        return {"profile": [round(x, 4) for x in p], "conditional": [round(x, 4) for x in conditional_rates(p)],
                "expected_mean_acceptance_length": round(mean_acceptance_length(p), 4), "seed": self.seed}
