"""`nwor-lab selfcheck`: one random mixed batch through every write policy, invariants checked.

Returns (and the CLI prints) JSON: the device and backend, per mode the window record and the
list of violated invariants (empty when all hold), and `ok`.
"""
from __future__ import annotations

import copy

import torch

from nwor_lab.config import LabConfig, nwor_modes
from nwor_lab.kv.cache import KVCacheSpec, PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.policies import make_policy
from nwor_lab.policies.invariants import check_invariants, off_reference, random_window, run_window
from nwor_lab.speculative import ScvRunner, check_against_sampler
from nwor_lab.ops.backend import backend


def _fresh_cache(spec: KVCacheSpec, device, before) -> PagedKVCache:
    cache = PagedKVCache(spec, device)
    cache.key.copy_(before[0]), cache.value.copy_(before[1])
    return cache


def selfcheck(config: LabConfig | None = None, *, device=None, seed: int = 0, num_reqs: int = 8,
              max_k: int = 4, cache_dtype: str = "auto", layout: str = "HND") -> dict:
    config = config or LabConfig()
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator().manual_seed(seed)
    spec = KVCacheSpec(num_layers=4, num_blocks=64, block_size=16, num_kv_heads=4, head_size=32,
                       dtype=torch.bfloat16, cache_dtype=cache_dtype, layout=layout)
    base = PagedKVCache(spec, "cpu")
    base.key.copy_(torch.randn(base.key.shape, generator=gen).to(spec.storage_dtype))
    base.value.copy_(torch.randn(base.value.shape, generator=gen).to(spec.storage_dtype))
    before = (base.key.to(device), base.value.to(device))
    scales = None
    if base.is_fp8:
        scales = (0.02 + 0.05 * torch.rand(spec.num_layers, spec.num_kv_heads, generator=gen))
    rw = random_window(_fresh_cache(spec, device, before), gen, num_reqs=num_reqs, max_k=max_k)

    metrics = LabMetrics()
    results = {}
    for mode in nwor_modes():
        cache = _fresh_cache(spec, device, before)
        if scales is not None:
            cache.k_scale.copy_(scales), cache.v_scale.copy_(scales * 0.5)
        off_after = off_reference(cache, before, rw)
        policy = make_policy(config.replace(nwor_mode=mode), cache, metrics)
        # SCV turns the sampler's output into the acceptance, as in the engine
        acceptance = ScvRunner(config.scv_mode).accept(rw.window, rw.sampled_token_ids)
        check_against_sampler(rw.window, acceptance, rw.sampled_token_ids, config.scv_mode)
        rec = run_window(policy, copy.copy(rw), chunks=2, acceptance=acceptance)
        problems = check_invariants(policy, cache, before, off_after, rw)
        if rec.drafts_committed != rec.num_accepted or rec.num_accepted != sum(rw.accepted_len):
            problems.append(f"{mode}: committed {rec.drafts_committed} drafts, SCV accepted {rec.num_accepted}, "
                            f"the sampler accepted {sum(rw.accepted_len)}")
        results[mode] = {"record": rec.to_dict(), "problems": problems}
    info = backend(device, config.backend)
    return {
        "ok": all(not r["problems"] for r in results.values()),
        "device": str(device), "backend": info.name, "backend_reason": info.reason,
        "scv_mode": config.scv_mode, "torch": torch.__version__, "seed": seed,
        "window": {"num_reqs": rw.window.num_reqs, "num_tokens": rw.window.num_tokens,
                   "num_draft_tokens": rw.window.num_draft_tokens, "accepted_len": rw.accepted_len},
        "modes": results, "metrics": metrics.summary(),
    }
