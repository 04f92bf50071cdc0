"""Forced acceptance for tree windows: which root path is accepted comes from a tree profile, not
from the target (benchmarks on random weights, the 8B engine), the tree form of
`speculative.synthetic.ForcedAcceptance`.

The tree profile extends the chain's format (`synthetic` module doc) by one field:

    profile p_d     unconditional, per DEPTH d = 1 .. D: the probability that the accepted path
                    reaches depth d (for a chain, depth = draft position: the chain's profile)
    ranks  w_d,c    per depth (or one row for every depth): the probability that the accepted node at
                    depth d is its parent's c-th child (c = 0: the drafter's best; EAGLE-2 numbers a
                    node's children best first). Rows sum to 1. Default: rank 0 always, which
                    makes a tree under a chain's profile decide exactly as that chain does.

Text form (`TreeForcedAcceptance.parse`): "tree:0.9,0.75,0.6,0.45,0.3;ranks=0.7,0.2,0.1" (one rank
row for every depth) or "...;ranks=0.7,0.3/0.8,0.2/1" (one row per depth, '/' between rows). JSON
form (`as_dict` / `from_dict`): {"kind": "tree", "profile": [...], "ranks": [[...], ...], "seed": 0}.
`nwor_lab.bench.tree_engine.measure_tree_profile` measures one on the shipped pair.

The walk (`accept_tree_forced`), per request, on the device: from t_last, at depth d draw u_d and
v_d, hashed from (seed, the request's key, position n + d) exactly as the chain's u_j (so depth d of a
tree and draft d of a chain see the same u); if u_d < c_d (the conditional rate) the child of rank
r (v_d through the cumulative rank weights, clamped to the children the node has) is accepted and
the walk moves there, else it stops. The token after the path is the target's argmax there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab.speculative.synthetic import ForcedAcceptance, check_profile, conditional_rates, hashed_uniforms
from nwor_lab.speculative.tree_accept import TreeVerdict, _row_tokens, _sampled_ids

RANK_SALT = 0x5EED      # v_d's seed offset (u_d uses the chain's seed)


def check_ranks(ranks, name: str = "ranks") -> tuple[tuple[float, ...], ...]:
    """Rows of rank weights (each >= 0, summing to 1 within 1e-6)."""
    out = []
    for d, row in enumerate(ranks):
        try:
            row = tuple(float(x) for x in row)
        except (TypeError, ValueError):
            raise ValueError(f"{name}[{d}]={row!r}: expected numbers, one weight per child rank") from None
        if not row or any(x < 0 for x in row) or abs(sum(row) - 1.0) > 1e-6:
            raise ValueError(f"{name}[{d}]={list(row)}: rank weights must be >= 0 and sum to 1")
        out.append(row)
    return tuple(out)


@dataclass(frozen=True)
class TreeForcedAcceptance(ForcedAcceptance):
    """A tree profile (module doc): `profile` per depth, `ranks` per depth (or one row), `seed`."""

    ranks: tuple = ((1.0,),)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "ranks", check_ranks(self.ranks))

    @classmethod
    def parse(cls, text: str, k: int = 0, seed: int = 0) -> "TreeForcedAcceptance":
        text = text.strip()
        body = text[len("tree:"):] if text.startswith("tree:") else text
        rates, _, ranks = body.partition(";ranks=")
        base = ForcedAcceptance.parse(rates, max(k, 1), seed)
        rows = ((1.0,),) if not ranks else tuple(tuple(float(x) for x in r.split(",")) for r in ranks.split("/"))
        return cls(base.profile, seed, rows)

    @classmethod
    def from_dict(cls, d: dict) -> "TreeForcedAcceptance":
        return cls(tuple(d["profile"]), int(d.get("seed", 0)), tuple(tuple(r) for r in d.get("ranks", [[1.0]])))

    def as_dict(self) -> dict:
        return {"kind": "tree", "profile": list(self.profile), "ranks": [list(r) for r in self.ranks],
                "seed": self.seed}

    def rank_cdf(self, depth: int, width: int, device) -> torch.Tensor:
        """[depth, width] float64 cumulative rank weights (the last column 1: v < 1 always lands)."""
        rows = [self.ranks[min(d, len(self.ranks) - 1)] for d in range(depth)]
        out = torch.zeros(depth, width, dtype=torch.float64)
        for d, row in enumerate(rows):
            acc = 0.0
            for c in range(width):
                acc += row[c] if c < len(row) else 0.0
                out[d, c] = acc
            out[d, -1] = 1.0
        return out.to(device)

    def describe(self, k: int) -> dict:
        p = check_profile(self.profile, k)
        return {"kind": "tree", "profile": [round(x, 4) for x in p],
                "conditional": [round(x, 4) for x in conditional_rates(p)],
                "ranks": [list(r) for r in self.ranks],
                "expected_mean_acceptance_length": round(1.0 + sum(p), 4), "seed": self.seed}


def forced_tables(acceptance: ForcedAcceptance, depth: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(conditional rates [depth] float64, cumulative rank weights [depth, width] float64) on `device`:
    made once, before any step (a captured step copies nothing from the host). A chain's
    ForcedAcceptance: rank 0 always."""
    rates = acceptance.conditional(depth, device)
    cdf = acceptance.rank_cdf(depth, width, device) if isinstance(acceptance, TreeForcedAcceptance) else \
        torch.ones(depth, width, dtype=torch.float64, device=device)
    return rates, cdf


def accept_tree_forced(window, target_logits: torch.Tensor, tables: tuple, seed: int,
                       req_keys: torch.Tensor) -> TreeVerdict:
    """The forced walk (module doc) over a TreeWindow whose `positions` are set -> TreeVerdict.
    tables: `forced_tables(...)` for the window's depth bound D and width >= its children table's;
    seed: the profile's; req_keys [R] int64."""
    T, V = target_logits.shape
    dev = target_logits.device
    R = window.num_reqs
    rates, cdf = tables
    depth = rates.shape[0]
    children = window.children                                     # [T, K]
    K = children.shape[1]
    cdf = cdf[:, :K].clone()
    cdf[:, -1] = 1.0
    tokens = _row_tokens(window, V)
    req = window.token_req.long()
    start = torch.zeros(R, dtype=torch.long, device=dev).scatter_reduce(
        0, req, torch.arange(T, device=dev), "amin", include_self=False)          # each t_last's row
    n = window.positions[start]
    keys = req_keys[:R].long()
    cur = start.clone()
    on_path = torch.zeros(T, dtype=torch.bool, device=dev)
    on_path.index_fill_(0, cur, True)     # not on_path[cur] = True: that copies a host scalar (no capture)
    active = torch.ones(R, dtype=torch.bool, device=dev)
    for d in range(1, depth + 1):
        u = hashed_uniforms(keys, n + d, seed)
        v = hashed_uniforms(keys, n + d, seed + RANK_SALT)
        kids = children[cur]                                          # [R, K]
        avail = ((kids >= 0) & (tokens[kids.clamp(min=0)] >= 0)).sum(1)
        rank = (v[:, None] >= cdf[d - 1][None, :]).sum(1)
        rank = torch.minimum(rank, avail - 1).clamp(min=0)
        child = kids.gather(1, rank[:, None]).squeeze(1)
        ok = active & (avail > 0) & (u < rates[d - 1])
        cur = torch.where(ok, child, cur)
        hits = torch.zeros(T + 1, dtype=torch.int32, device=dev)
        on_path |= hits.index_add_(0, torch.where(ok, child, T), torch.ones_like(child, dtype=torch.int32))[:T] > 0
        active &= ok
    last = target_logits[cur].argmax(-1)
    acc = window.token_depth.long()[cur].to(torch.int32)
    return TreeVerdict(_sampled_ids(window, tokens, on_path, acc, last), on_path, acc)
