"""The seam between the state store and one kind of recurrence (gated DeltaNet, a Mamba2 scan, ...).

The store and its strategies (policy.py, off / snapshots / cow / replay / stage) keep *a* state per
request and layer; what the state is and how rows advance it is a `Recurrence`'s:

    inputs        the per-row inputs, in the order `StatePolicy.recur(layer, *inputs)` takes them
    options       keyword arguments that are not per row (a scale, per-head parameters)
    input_tails   each input's shape after its row dim: input i is `[T, *input_tails(spec)[i]]`
    state_shape   one request's state in one layer (float32), default `[H, K, V]`
    output_tail   the output per row, default `[H, V]`
    identity      per-row input values under which a row leaves the state **bit for bit** as it
                  was (gated DeltaNet: g = 0, beta = 0; Mamba2: dt = 0). `cow` / `replay` re-advance
                  with the rejected rows set to it, and the device layout runs padding rows with it,
                  so one fixed-shape run serves every acceptance without a host sync.
    max_token_rows  the most rows per request the token-by-token form runs (the device layout's bound)
    run           the rows of G requests from their states: state `[G, *state_shape]`, inputs
                  `[G, s, *tail]` -> (o `[G, s, *output_tail]` float32, the states after local rows
                  keep_from .. s-1 `[G, s-keep_from, *state_shape]` float32)

The spec names the recurrence (`RecurrentSpec.recurrence`, default gated DeltaNet), so a store is
built for it and every strategy over that store runs it: a new recurrence is one module with a
subclass, nothing in the base or the strategies changes (tests/test_mamba2.py runs every strategy
over the Mamba2 scan). The causal conv in front of the recurrence stays the store's (both kinds have
one; its state is `[W-1, C]`).

A plug-in holds no per-instance state (two instances of a class are equal), so a spec stays a
hashable value.
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch


class Recurrence:
    """Base class of the plug-ins; see the module docstring for what each member means."""

    name: ClassVar[str] = "?"
    inputs: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[str, ...]] = ()
    identity: ClassVar[dict[str, float]] = {}
    max_token_rows: ClassVar[int] = 16

    def input_tails(self, spec) -> tuple[tuple[int, ...], ...]:
        raise NotImplementedError

    def state_shape(self, spec) -> tuple[int, ...]:
        """One [K, V] matrix per head."""
        return (spec.num_heads, spec.head_k_dim, spec.head_v_dim)

    def output_tail(self, spec) -> tuple[int, ...]:
        return (spec.num_heads, spec.head_v_dim)

    def row_input_bytes(self, spec) -> int:
        """What one row feeds one layer's recurrence, kept as float32 (what replay and cow keep)."""
        return 4 * sum(math.prod(tail) for tail in self.input_tails(spec))

    def run(self, state: torch.Tensor, inputs: tuple, options: dict, keep_from: int, backend: str):
        raise NotImplementedError

    def masked(self, inputs: tuple, keep: torch.Tensor) -> tuple:
        """inputs `[G, s, ...]`, keep `[G, s]` bool -> the inputs with every row where keep is False
        set to the identity (those rows then pass the state unchanged, bit for bit)."""
        out = []
        for name, t in zip(self.inputs, inputs):
            if name in self.identity:
                mask = keep.reshape(*keep.shape, *[1] * (t.dim() - keep.dim()))
                t = torch.where(mask, t, torch.full((), self.identity[name], dtype=t.dtype, device=t.device))
            out.append(t)
        return tuple(out)

    def check(self, spec, inputs: tuple, options: dict, num_rows: int) -> None:
        """Clear errors for a `recur` call: the count, each input's shape `[T, *tail]`, the options."""
        if len(inputs) != len(self.inputs):
            raise ValueError(f"recur: {self.name} takes {len(self.inputs)} per-row inputs "
                             f"({', '.join(self.inputs)}), got {len(inputs)}")
        for name, t, tail in zip(self.inputs, inputs, self.input_tails(spec)):
            if not torch.is_tensor(t) or tuple(t.shape) != (num_rows, *tail):
                got = tuple(t.shape) if torch.is_tensor(t) else type(t).__name__
                raise ValueError(f"recur: {name} expected [T={num_rows}, {', '.join(map(str, tail))}], got {got}")
        unknown = set(options) - set(self.options)
        if unknown:
            raise ValueError(f"recur: {self.name} takes the options {', '.join(self.options) or '(none)'}, "
                             f"not {', '.join(sorted(unknown))}")

    @staticmethod
    def fold_heads(t: torch.Tensor) -> torch.Tensor:
        """`[G, s, H, ...]` -> `[s, G*H, ...]`: the G requests folded into the heads, for references
        written over one sequence (each (request, head) pair is its own recurrence)."""
        return t.transpose(0, 1).reshape(t.shape[1], t.shape[0] * t.shape[2], *t.shape[3:])

    @staticmethod
    def unfold_heads(t: torch.Tensor, num_requests: int) -> torch.Tensor:
        """`[s, G*H, ...]` -> `[G, s, H, ...]` (the inverse of fold_heads; G = num_requests)."""
        return t.view(t.shape[0], num_requests, t.shape[1] // num_requests, *t.shape[2:]).transpose(0, 1)

    def __eq__(self, other) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
