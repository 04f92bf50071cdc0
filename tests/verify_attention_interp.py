"""Run verify_attention's Triton kernels under Triton's CPU interpreter, in a fresh process.

    python tests/verify_attention_interp.py <specs.json> <results.json>

specs.json: a list of {"id", "kind", "case": make_verify_attention_case kwargs (dtypes as names),
"launch": launch knobs}. kind "vs_reference": kernel vs the torch reference; "window_vs_cache":
the kernel on a stage window vs the same window committed to the cache (must be bit-identical);
"split_tail_identical": the window tail split (mixed tile, then window-only tiles) vs one mixed
tail loop, same launch otherwise (must be bit-identical);
"fp8_round_trip": the kernel's quantise-dequantise vs nwor_lab.ops.quant on every fp8 value,
the midpoints between them and random values. A "ring": {"W", "slack", "log"} entry turns a
vs_reference case into a sliding-window one: the kernel on the case moved into a ring of W + slack
slots (with cow's log when "log") against the reference on the same linear case with the window;
"ring": {"W", "linear": true} runs the window on the linear cache. A "tree": {"parents"} entry makes
the case a pass over tree windows (make_tree_attention_case); "tree_past_keys": true gives a plain case a
tree starting past its last key (the tree path, every key under the position rule); "tree_lo_shift": s moves
the tree s keys past its first window row (those rows follow the position rule; the bits, shifted, stay the
kernel's and the reference's alike). results.json: {id: {...numbers...}}.
A separate process because the interpreter must be switched on before triton is imported, and
stays on for the whole process (tests/test_verify_attention.py starts this one).
"""
from __future__ import annotations

import json
import os
import sys
import time


def _case_kwargs(spec: dict) -> dict:
    import torch
    kw = dict(spec)
    if "dtype" in kw:
        kw["dtype"] = getattr(torch, kw["dtype"])
    return kw


def run(spec: dict) -> dict:
    import torch

    from nwor_lab.ops import _verify_attention_triton as kernels
    from nwor_lab.ops.verify_attention import (make_verify_attention_case, verify_attention,
                                               verify_attention_reference)
    from nwor_lab.ops.verify_attention_cases import (RING_FIELDS, TREE_FIELDS, as_ring, make_tree_attention_case,
                                                     window_written_to_cache, with_window)

    kind = spec["kind"]
    if kind == "fp8_round_trip":
        from nwor_lab.ops.quant import dequantize, quantize
        storage = getattr(torch, spec["storage"])
        every = torch.arange(256, dtype=torch.uint8).view(storage).float()
        every = every[torch.isfinite(every)].unique()
        scale = spec["scale"]
        x = torch.cat([every, (every[1:] + every[:-1]) / 2]) * scale       # fp8 values and exact ties
        gen = torch.Generator().manual_seed(0)
        x = torch.cat([x, torch.randn(4096, generator=gen) * 3, torch.randn(4096, generator=gen) * 1e-3])
        n = 1 << (x.numel() - 1).bit_length()
        x = torch.cat([x, torch.zeros(n - x.numel())])
        got = kernels.fp8_round_trip_check(x, storage, scale)
        want = dequantize(quantize(x[:, None, None], storage, torch.tensor([scale])), torch.float32,
                          torch.tensor([scale])).flatten()
        return dict(mismatches=int((got != want).sum()), n=n)

    if "tree" in spec:          # tree windows: {"parents": [[...] per request]}, the case's kwargs otherwise
        case = make_tree_attention_case(spec["tree"]["parents"], **_case_kwargs(spec["case"]))
    else:
        case = make_verify_attention_case(**_case_kwargs(spec["case"]))
    if spec.get("tree_past_keys"):   # a tree that starts past every key: all keys follow the position rule
        n_win = case.win_start.diff() if case.win_start is not None else torch.zeros_like(case.cache_lens)
        case.tree_lo = (case.cache_lens + n_win).to(torch.int32)
        case.tree_mask = torch.zeros(case.q.shape[0], 1, dtype=torch.int64)
    if spec.get("tree_lo_shift"):    # the tree's bits start past the window's first rows (those follow positions)
        case.tree_lo = (case.tree_lo + spec["tree_lo_shift"]).to(torch.int32)
    launch = spec.get("launch", {})

    def kernel(c):
        if not launch:
            return verify_attention(**c.kwargs(), backend="triton")
        a = c.kwargs()
        out = torch.empty(a["q"].shape, dtype=a["q"].dtype)
        scales = [s.reshape(-1) if s is not None else None for s in (a["k_scale"], a["v_scale"])]
        ring = {name: a[name] for name in RING_FIELDS + TREE_FIELDS if name in a}
        return kernels.launch(a["q"], a["key_cache"], a["value_cache"], a["block_tables"], a["cache_lens"],
                              a["query_start_loc"], a["positions"], a["win_key"], a["win_value"],
                              a["win_rows"], a["win_start"], *scales, a["scale"], out, **ring, **launch)

    if "ring" in spec:
        rs = spec["ring"]
        linear = with_window(case, rs["W"])
        moved = linear if rs.get("linear") else as_ring(case, rs["W"], rs["W"] + rs.get("slack", 0),
                                                        log=rs.get("log", False), seed=spec["case"].get("seed", 0))
        t0 = time.perf_counter()
        got = kernel(moved)
        seconds = time.perf_counter() - t0
        ref = verify_attention_reference(**linear.kwargs())
        err = (got.float() - ref.float()).abs()
        tol_excess = err - (spec["tol"] + spec["tol"] * ref.float().abs())
        return dict(max_err=float(err.max()), max_ref=float(ref.float().abs().max()),
                    worst_excess=float(tol_excess.max()), finite=bool(torch.isfinite(got).all()), seconds=seconds)

    t0 = time.perf_counter()
    got = kernel(case)
    seconds = time.perf_counter() - t0
    if kind == "split_tail_identical":
        # the window tail split into a mixed tile and window-only tiles (the default) against the
        # single mixed tail loop: the same tiles and values, so the same bits
        single = kernels.launch(*_launch_args(case), **{**launch, "split_tail": False})
        split = kernels.launch(*_launch_args(case), **{**launch, "split_tail": True})
        return dict(bit_identical=bool(torch.equal(single, split)),
                    max_diff=float((single.float() - split.float()).abs().max()), seconds=seconds)
    if kind == "window_vs_cache":
        committed = window_written_to_cache(case)
        twin = kernel(committed)
        ref = verify_attention_reference(**committed.kwargs())
        return dict(bit_identical=bool(torch.equal(got, twin)), max_diff=float((got.float() - twin.float()).abs().max()),
                    err_vs_committed_reference=float((got.float() - ref.float()).abs().max()), seconds=seconds)
    ref = verify_attention_reference(**case.kwargs())
    err = (got.float() - ref.float()).abs()
    tol_excess = err - (spec["tol"] + spec["tol"] * ref.float().abs())
    return dict(max_err=float(err.max()), max_ref=float(ref.float().abs().max()),
                worst_excess=float(tol_excess.max()), finite=bool(torch.isfinite(got).all()), seconds=seconds)


def _launch_args(c):
    import torch
    a = c.kwargs()
    scales = [x.reshape(-1) if x is not None else None for x in (a["k_scale"], a["v_scale"])]
    return (a["q"], a["key_cache"], a["value_cache"], a["block_tables"], a["cache_lens"], a["query_start_loc"],
            a["positions"], a["win_key"], a["win_value"], a["win_rows"], a["win_start"], *scales, a["scale"],
            torch.empty(a["q"].shape, dtype=a["q"].dtype))


def main(argv) -> int:
    os.environ["TRITON_INTERPRET"] = "1"              # before anything imports triton
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    import torch
    torch.set_num_threads(1)
    with open(argv[1]) as f:
        specs = json.load(f)
    from nwor_lab.ops import _verify_attention_triton as kernels
    assert kernels.INTERPRETED, "the interpreter did not switch on: triton was imported before TRITON_INTERPRET"
    results = {}
    for spec in specs:
        try:
            results[spec["id"]] = run(spec)
        except Exception as err:                     # report per case, keep going
            import traceback
            results[spec["id"]] = dict(error=f"{type(err).__name__}: {err}", trace=traceback.format_exc()[-3000:])
    with open(argv[2], "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
