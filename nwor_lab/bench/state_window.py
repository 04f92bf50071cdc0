"""The state strategies over one verify window, layer level: `python -m nwor_lab.bench.state_window --json`.

For each strategy (nwor_lab.state) and batch size: `batch` requests of t_last + k drafts, every
linear-attention layer of the shape advanced (conv + gated delta rule) through the policy, then the
commit with a fixed acceptance pattern (request r accepts r mod (k+1) drafts: every length). Timed:
  window_ms   begin + all layers' conv and recurrence + commit, median of `reps` (after a warm-up)
  commit_ms   the commit alone
and, from the strategies' declarations and counters: state bytes per request steady and during a
window, the bytes the window actually held at its peak (per request), rows recomputed at commit. The store is
filled with random states first (a decoded prefix).

Shapes: `qwen3-next` (Qwen3-Next-80B-A3B's linear layers: 36 x 32 value heads x 128 x 128, conv 8192
wide, bf16 inputs) and `tiny` (the toy hybrid's). The backend is fla's kernels on CUDA when fla-core
imports, else the torch reference (`backend` in the JSON). No engine, no attention layers: the
cost of the state discipline alone. Timings are reported, never asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from nwor_lab.config import LabConfig
from nwor_lab.ops.gated_delta import fla_available, l2norm
from nwor_lab.state import STATE_POLICIES, RecurrentSpec, make_state_policy, make_state_store, qwen3_next_spec
from nwor_lab.window import Acceptance, Window


def shape(name: str, dtype) -> RecurrentSpec:
    if name == "qwen3-next":
        return qwen3_next_spec(dtype)
    if name == "tiny":
        return RecurrentSpec(num_layers=3, num_heads=4, head_k_dim=8, head_v_dim=8, conv_dim=64, conv_width=4,
                             dtype=dtype)
    raise ValueError(f"shape={name!r}: choose qwen3-next or tiny")


def layer_inputs(spec: RecurrentSpec, T: int, device, gen: torch.Generator) -> list[dict]:
    """One window's inputs for every layer: conv x [T, C], weight [C, W]; q, k [T, H, K], v, g, beta."""
    H, K, V = spec.num_heads, spec.head_k_dim, spec.head_v_dim
    out = []
    for _ in range(spec.num_layers):
        r = lambda *s: torch.randn(*s, generator=gen).to(device)         # noqa: E731
        out.append(dict(x=r(T, spec.conv_dim).to(spec.dtype), weight=(r(spec.conv_dim, spec.conv_width) * 0.5).to(spec.dtype),
                        q=l2norm(r(T, H, K)).to(spec.dtype), k=l2norm(r(T, H, K)).to(spec.dtype),
                        v=r(T, H, V).to(spec.dtype), g=-torch.rand(T, H, generator=gen).to(device) * 0.1,
                        beta=torch.sigmoid(r(T, H)).to(spec.dtype)))
    return out


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_strategy(name: str, spec: RecurrentSpec, batch: int, k: int, device, reps: int, inputs, backend: str) -> dict:
    config = LabConfig(state_mode=name, validate=False, backend=backend)
    store = make_state_store(config, spec, batch, k, device)
    gen = torch.Generator().manual_seed(1)
    store.recurrent.copy_(torch.randn(store.recurrent.shape, generator=gen) * 0.1)
    store.conv.copy_(torch.randn(store.conv.shape, generator=gen).to(store.conv.dtype))
    policy = make_state_policy(config, store)
    T = batch * (k + 1)
    window = Window.from_counts([k + 1] * batch, [k] * batch, torch.arange(T, device=device))
    accepted = torch.arange(batch, device=device) % (k + 1)
    acceptance = Acceptance.from_accepted_len(window, accepted.to(torch.int32))
    slots = torch.arange(batch, device=device)
    totals, commits = [], []
    for rep in range(reps + 1):                        # the first is the warm-up (fla's autotune, allocations)
        rows_before = policy.stats["rows_recomputed"]
        _sync(device)
        t0 = time.perf_counter()
        policy.begin(window, slots)
        for layer, c in enumerate(inputs):
            policy.conv(layer, c["x"], c["weight"])
            policy.recur(layer, c["q"], c["k"], c["v"], c["g"], c["beta"])
        _sync(device)
        t1 = time.perf_counter()
        policy.commit(acceptance)
        _sync(device)
        t2 = time.perf_counter()
        if rep:
            totals.append(t2 - t0)
            commits.append(t2 - t1)
    cls = STATE_POLICIES[name]
    steady = cls.steady_bytes_per_request(k, spec)
    return {"strategy": name, "batch": batch, "k": k, "window_ms": 1e3 * statistics.median(totals),
            "commit_ms": 1e3 * statistics.median(commits),
            "state_bytes_steady": steady, "state_bytes_window": steady + cls.transient_bytes_per_request(k, spec),
            "bytes_kept_peak_per_request": policy.stats["bytes_kept_peak"] // batch,
            "rows_recomputed_per_window": policy.stats["rows_recomputed"] - rows_before}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m nwor_lab.bench.state_window", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON document (the default prints rows)")
    p.add_argument("--shape", default="qwen3-next", choices=("qwen3-next", "tiny"))
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="auto", choices=("auto", "torch"),
                   help="auto: fla's kernels on CUDA when fla-core imports; torch: the references")
    p.add_argument("--strategies", nargs="+", default=list(STATE_POLICIES), choices=list(STATE_POLICIES))
    a = p.parse_args(argv)
    if min(a.batch) < 1 or a.k < 1 or a.reps < 1:
        p.error("--batch, --k and --reps must be >= 1")
    dtype = torch.bfloat16 if torch.device(a.device).type == "cuda" else torch.float32
    spec = shape(a.shape, dtype)
    backend = "fla" if a.backend == "auto" and fla_available(a.device) else "torch"
    rows = []
    with torch.no_grad():
        for batch in a.batch:
            inputs = layer_inputs(spec, batch * (a.k + 1), a.device, torch.Generator().manual_seed(batch))
            for name in a.strategies:
                rows.append(run_strategy(name, spec, batch, a.k, a.device, a.reps, inputs, a.backend))
    device = torch.cuda.get_device_name() if torch.device(a.device).type == "cuda" else "cpu"
    doc = {"benchmark": "state_window", "shape": a.shape, "device": device, "backend": backend,
           "torch": torch.__version__, "rows": rows}
    print(json.dumps(doc) if a.json else "\n".join(json.dumps(r) for r in rows))
    return doc


if __name__ == "__main__":
    main()
