"""Exercise (d): the CoW restore — put back the old bits of every rejected draft's slot.

Write `cow_restore(key_cache, value_cache, log_key, log_value, draft_slots, draft_mask)
-> (key_cache, value_cache)`; the spec is the docstring of `nwor_lab.exercises.solutions.cow_restore`.
Check it with `exercises.check_cow_restore(your_fn)`. Compared bit for bit.

Cases: no drafts, all / none accepted, padding drafts (slot -1: restoring "slot -1" would hit the
cache's last slot), float32 / bfloat16 / float8_e4m3fn caches holding random bits (NaN payloads
included), NHD and HND layouts, block_size == num_kv_heads (a layout mix-up still has the right
shape there).
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, dtype_name
from nwor_lab.ops.quant import raw
from nwor_lab.viz.cache import cache_grids
from nwor_lab.viz.states import SlotState

_RAW = {4: (torch.int32, -2**31, 2**31), 2: (torch.int16, -2**15, 2**15), 1: (torch.uint8, 0, 256)}


def _random_bits(d: Dice, shape, dtype) -> torch.Tensor:
    """A tensor of `dtype` holding uniformly random bit patterns (NaNs and infs included)."""
    int_dtype, lo, hi = _RAW[torch.empty((), dtype=dtype).element_size()]
    return torch.randint(lo, hi, shape, dtype=int_dtype, generator=d.gen).view(dtype)


def _cache(d: Dice, nb, bs, h, dim, dtype, layout) -> torch.Tensor:
    """`[NB, BS, H, D]` logical view; HND stores `[NB, H, BS, D]` and permutes (as nwor_lab.kv)."""
    if layout == "HND":
        return _random_bits(d, (nb, h, bs, dim), dtype).transpose(1, 2)
    return _random_bits(d, (nb, bs, h, dim), dtype)


def _case(d: Dice, geometry, groups, slots, note="random") -> Case:
    """geometry: (NB, BS, H, D, dtype, layout); groups: per request (drafts, accepted);
    slots: the drafts' slots (-1 = padding)."""
    nb, bs, h, dim, dtype, layout = geometry
    mask, names = [], []
    for r, (k, a) in enumerate(groups):
        mask += [j < a for j in range(k)]
        names += [f"req {r} · d{j + 1}" for j in range(k)]
    slots = torch.tensor(slots, dtype=torch.int64)
    log = [_random_bits(d, (len(mask), h, dim), dtype) for _ in range(2)]
    for t in log:
        raw(t)[slots < 0] = 0          # the log holds zeros for padding drafts
    return Case(dict(key_cache=_cache(d, nb, bs, h, dim, dtype, layout),
                     value_cache=_cache(d, nb, bs, h, dim, dtype, layout), log_key=log[0], log_value=log[1],
                     draft_slots=slots, draft_mask=torch.tensor(mask, dtype=torch.bool)),
                note + f" · {str(dtype).replace('torch.', '')} {layout}, NB={nb} BS={bs} H={h} D={dim}",
                dict(names=names))


F32, BF16, FP8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn


def cases(seed: int, n: int):
    fixed = [   # each draws its cache's random bits from the cases' dice when it is made
        lambda d: _case(d, (2, 4, 2, 2, F32, "NHD"), [], [], "edge: no drafts"),
        lambda d: _case(d, (2, 4, 2, 2, F32, "NHD"), [(3, 3)], [1, 2, 3], "edge: all accepted"),
        lambda d: _case(d, (2, 4, 2, 2, F32, "NHD"), [(3, 0)], [1, 2, 3], "edge: none accepted"),
        lambda d: _case(d, (2, 4, 2, 2, F32, "NHD"), [(3, 1)], [4, -1, 5],
                        "edge: a rejected padding draft (slot -1)"),
        lambda d: _case(d, (3, 2, 2, 3, F32, "HND"), [(2, 1), (2, 0)], [0, 3, 4, 1],
                        "edge: HND layout with block_size == num_kv_heads"),
        lambda d: _case(d, (2, 4, 1, 4, BF16, "NHD"), [(3, 1)], [0, 6, 7], "edge: bfloat16 random bits"),
        lambda d: _case(d, (2, 4, 2, 4, FP8, "HND"), [(4, 2)], [2, 3, 4, 5], "edge: fp8 random bits, HND"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes grow with it)."""
    size = growing(i, count)
    bs = d.choice((1, 2, 4, 8))
    h = bs if d.chance(0.3) else d.int(1, 3)
    geometry = (d.int(1, size + 1), bs, h, d.int(1, 4), d.choice((F32, F32, BF16, FP8)),
                d.choice(("NHD", "HND")))
    num_slots = geometry[0] * bs
    groups, total = [], 0
    for _ in range(d.int(0, size + 1)):
        k = min(d.int(1, 4), num_slots - total)   # draft slots are distinct: at most one per slot
        if k:
            groups.append((k, d.int(0, k)))
            total += k
    slots = d.perm(num_slots)[:total].tolist()
    slots = [-1 if d.chance(0.15) else s for s in slots]
    return _case(d, geometry, groups, slots)


def _slot_diff(expected: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """`[NB * BS]` bool: the slot's raw bits differ somewhere in its heads."""
    return (raw(expected) != raw(got)).flatten(2).any(-1).reshape(-1)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected a pair (key_cache, value_cache), got {type(got).__name__}"
    for name, e, g in (("key_cache", expected[0], got[0]), ("value_cache", expected[1], got[1])):
        if not isinstance(g, torch.Tensor) or g.shape != e.shape or g.dtype != e.dtype:
            return (f"{name}: expected a {dtype_name(e.dtype)} tensor of shape {list(e.shape)}, "
                    f"got {dtype_name(getattr(g, 'dtype', type(g).__name__))} {list(getattr(g, 'shape', []))}")
        bad = _slot_diff(e, g)
        if bool(bad.any()):
            s = int(bad.nonzero()[0])
            b, o = divmod(s, e.shape[1])
            alike = _values(e[b, o]) == _values(g[b, o])
            return (f"{name}: slot {s} (block {b}, offset {o}) differs bit for bit from expected "
                    f"({_what(case, s)})\n    expected {_values(e[b, o])}  bits {_bits(e[b, o])}"
                    f"\n    got      {_values(g[b, o])}  bits {_bits(g[b, o])}"
                    + ("\n    (the values print alike — a NaN prints as nan whatever its payload, -0.0 "
                       "equals 0.0 — only the raw bits tell them apart: copy bits, compare bits)" if alike else ""))
    return None


def _values(row: torch.Tensor, limit: int = 6) -> str:
    """The first values of one slot's `[H, D]` row, as numbers (NaN shows as nan)."""
    v = [float(x) for x in row.float().reshape(-1)[:limit]]
    return "[" + ", ".join(f"{x:.4g}" for x in v) + (", ...]" if row.numel() > limit else "]")


def _bits(row: torch.Tensor, limit: int = 6) -> str:
    """The first raw bit patterns of one slot's `[H, D]` row, in hex (what a bit-exact restore keeps)."""
    size = row.element_size()
    v = [int(x) & ((1 << (8 * size)) - 1) for x in raw(row).reshape(-1)[:limit]]
    return "[" + " ".join(f"{x:0{2 * size}x}" for x in v) + (" ...]" if row.numel() > limit else "]")


def _what(case, slot: int) -> str:
    slots = case.inputs["draft_slots"].tolist()
    if slot not in slots:
        return "not a draft slot: it must stay untouched" + (
            "; slot -1 is padding, it wraps to the last slot" if slot == case.inputs["key_cache"].shape[0]
            * case.inputs["key_cache"].shape[1] - 1 and -1 in slots else "")
    i = slots.index(slot)
    accepted = bool(case.inputs["draft_mask"][i])
    return f"draft {i}, {case.context['names'][i]}, " + ("accepted: keep what the window wrote" if accepted
                                                         else "rejected: restore its logged bits")


def _equals_log(got, inp, i: int, slot: int, bs: int) -> bool:
    """The slot now holds draft i's logged (old) K and V bits."""
    b, o = divmod(slot, bs)
    return bool(torch.equal(raw(got[0])[b, o], raw(inp["log_key"])[i]) and
                torch.equal(raw(got[1])[b, o], raw(inp["log_value"])[i]))


def draw(case, expected, got):
    inp = case.inputs
    nb, bs = inp["key_cache"].shape[:2]
    slots, mask, names = inp["draft_slots"].tolist(), inp["draft_mask"].tolist(), case.context["names"]
    base = torch.full((nb * bs,), int(SlotState.COMMITTED), dtype=torch.int8)   # every slot holds data
    labels, marks = {}, {}
    for i, (s, keep) in enumerate(zip(slots, mask)):
        if s >= 0:
            base[s] = SlotState.COMMITTED if keep else SlotState.RESTORED
            labels[s] = f"draft {i}: {names[i]} · " + ("accepted" if keep else "rejected, restored")
            marks[s] = f"d{i}" + ("✓" if keep else "✗")
    mine, wrong, why = base.clone(), [], dict(labels)
    try:
        bad = _slot_diff(expected[0], got[0]) | _slot_diff(expected[1], got[1])
        untouched = ~_slot_diff(inp["key_cache"], got[0])     # still what `off` left there
        for s in bad.nonzero().flatten().tolist():
            wrong.append(s)
            i = slots.index(s) if s in slots else None
            if i is not None and mask[i] and _equals_log(got, inp, i, s, bs):
                mine[s], note = SlotState.RESTORED, " · restored, but this draft was ACCEPTED"
            elif i is not None and not mask[i] and bool(untouched[s]):
                mine[s], note = SlotState.REJECTED, " · NOT restored: rejected K/V left"
            elif i is not None and not mask[i]:       # written back, but not the bits the log holds for it
                mine[s], note = SlotState.RESTORED, " · restored with the wrong bits (another slot's, layer's or half's)"
            else:                                     # not a draft (or an accepted one) and changed: written over
                mine[s], note = SlotState.WRITTEN, " · written over: its bits differ from expected"
            b, o = divmod(s, bs)
            note += f"<br>key bits yours {_bits(got[0][b, o], 4)}, expected {_bits(expected[0][b, o], 4)}"
            why[s] = why.get(s, f"slot {s}: not a draft, must stay untouched") + note
    except Exception:  # noqa: BLE001 - unreadable output: the text report says why
        pass
    bits = ""
    if wrong:
        s0 = wrong[0]
        b0, o0 = divmod(s0, bs)
        try:
            gk = got[0][b0, o0] if _slot_diff(expected[0], got[0])[s0] else got[1][b0, o0]
            ek = expected[0][b0, o0] if _slot_diff(expected[0], got[0])[s0] else expected[1][b0, o0]
            bits = (f"; slot {s0}: expected bits {_bits(ek, 4)} = {_values(ek, 4)}, "
                    f"yours {_bits(gk, 4)} = {_values(gk, 4)}")
        except Exception:  # noqa: BLE001 - unreadable output: the text report says why
            pass
    return cache_grids([dict(states=base, title="expected", annotations=labels, cell_text=marks, highlight=wrong),
                        dict(states=mine, title="your cow_restore", annotations=why, cell_text=marks,
                             highlight=wrong)],
                       title="cow_restore: the cache after restoring the rejected drafts",
                       subtitle=f"{case.note}; d<i>✓ accepted, d<i>✗ rejected{bits}", block_size=bs)


def _predict_inputs():
    nan = torch.tensor([float("nan"), -0.0], dtype=torch.float32)
    key = torch.zeros(1, 2, 1, 2)
    log = nan.view(1, 1, 2).clone()
    return dict(key_cache=key, value_cache=key.clone(), log_key=log, log_value=log.clone(),
                draft_slots=torch.tensor([1]), draft_mask=torch.tensor([False]))


PREDICT = Prediction(
    question="a rejected draft's slot held [nan, -0.0] (float32) before the window. After a perfect, "
             "bit-exact restore, does the value comparison `(restored == logged).all()` say True?",
    inputs=_predict_inputs,
    answer=lambda out: bool((out[0][0, 1, 0] == torch.tensor([float("nan"), -0.0])).all()),
    explain=lambda same: (f"{same}: NaN != NaN, so a value comparison fails a perfect restore — and -0.0 == 0.0 "
                          f"would pass a wrong one. Compare (and copy) raw bits: nwor_lab.ops.quant.raw(t) is a "
                          f"same-size integer view."))

HINTS = (
    "Slot s is block s // block_size, offset s % block_size; index the cache as cache[block, offset] "
    "(a [H, D] row) — that is right for HND too, because the cache is a permuted view. Restore only "
    "drafts that are rejected (draft_mask False) and real (slot != -1).",
    "Copy bits, not values: `raw(cache)[b, o] = raw(log)[i]` with `from nwor_lab.ops.quant import raw` "
    "(an integer view of the same memory), so NaN payloads, -0.0 and fp8 bytes come back exactly.",
)

EXERCISE = Exercise("cow_restore", cases, compare, draw, hints=HINTS, predict=PREDICT)
