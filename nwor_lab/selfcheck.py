"""`nwor-lab selfcheck`: one random mixed batch through every write policy, invariants checked.

Returns (and the CLI prints) JSON: the device and backend, per mode the window record and the
list of violated invariants (empty when all hold), and `ok`. `violations` (per mode and in one
list) says for each broken invariant which mode, which tensor, and the first bad slot and layer:

    committed-slots-written     a kept slot differs from what `off` writes
    window-slots-written        (a policy that does not preserve rejected slots) a slot of the
                                window differs from what `off` writes
    rejected-slots-preserved    (cow, stage) a rejected draft slot differs from before the window
    outside-window-untouched    a slot outside the window changed
    committed-equals-accepted   the record's committed drafts differ from what SCV / the sampler accepted

These are the rules of `nwor_lab.policies.invariants.check_invariants`, located slot by slot.
"""
from __future__ import annotations

import copy

import torch

from nwor_lab._checks import check_backend_device, check_device
from nwor_lab.config import LabConfig, nwor_modes
from nwor_lab.kv.blocks import slot_to_block_offset
from nwor_lab.kv.cache import KVCacheSpec, PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.policies import make_policy
from nwor_lab.policies.invariants import check_invariants, off_reference, random_window, run_window
from nwor_lab.speculative import ScvRunner, check_against_sampler
from nwor_lab.ops.backend import backend
from nwor_lab.ops.quant import raw


def _fresh_cache(spec: KVCacheSpec, device, before) -> PagedKVCache:
    cache = PagedKVCache(spec, device)
    cache.key.copy_(before[0]), cache.value.copy_(before[1])
    return cache


def _first_bad(now, want, slots, block_size):
    """First slot of `slots` (in their order) whose rows differ between the raw stacked tensors
    `now` and `want` `[L, NB, BS, H, D]` -> (slot, layer), or None."""
    if slots.numel() == 0:
        return None
    block, offset = slot_to_block_offset(slots, block_size)
    differs = (now[:, block, offset] != want[:, block, offset]).flatten(2).any(-1)      # [L, n]
    bad = differs.any(0).nonzero().flatten()
    if bad.numel() == 0:
        return None
    col = int(bad[0])
    return int(slots[col]), int(differs[:, col].nonzero()[0])


def locate_violations(mode: str, policy, cache: PagedKVCache, before, off_after, rw) -> list[dict]:
    """Every broken cache invariant of one window, each with its first bad slot and layer."""
    w, bs = rw.window, cache.spec.block_size
    slots = w.slot_mapping.cpu()
    commit = w.commit_mask_from(torch.tensor(rw.accepted_len, dtype=torch.int32)).cpu()
    real = slots >= 0
    outside = torch.ones(cache.num_slots, dtype=torch.bool)
    outside[slots[real]] = False
    rules = [("committed-slots-written", slots[real & commit], 2, "differs from what off writes")]
    if policy.preserves_rejected_slots:
        rules.append(("rejected-slots-preserved", slots[real & ~commit], 1,
                      "is not bit-identical to before the window"))
    else:
        rules.append(("window-slots-written", slots[real], 2, "differs from what off writes"))
    rules.append(("outside-window-untouched", torch.nonzero(outside).flatten(), 1, "changed"))
    found = []
    for what, now, old, off in (("key", cache.key, before[0], off_after[0]),
                                ("value", cache.value, before[1], off_after[1])):
        now, expected = raw(now).cpu(), {1: raw(old).cpu(), 2: raw(off).cpu()}
        for invariant, where, against, how in rules:
            hit = _first_bad(now, expected[against], where, bs)
            if hit is not None:
                slot, layer = hit
                block, offset = slot_to_block_offset(slot, bs)
                found.append({"mode": mode, "invariant": invariant, "tensor": what, "slot": slot, "layer": layer,
                              "message": f"{mode}: invariant {invariant} broken: {what} slot {slot} (block {block}, "
                                         f"offset {offset}) of layer {layer} {how}"})
    return found


def selfcheck(config: LabConfig | None = None, *, device=None, seed: int = 0, num_reqs: int = 8,
              max_k: int = 4, cache_dtype: str = "auto", layout: str = "HND") -> dict:
    config = config or LabConfig()
    device = check_device("device", device or ("cuda" if torch.cuda.is_available() else "cpu"))
    check_backend_device(config.backend, device)     # backend 'cuda' on CPU tensors would be ignored
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
        violations = locate_violations(mode, policy, cache, before, off_after, rw)
        if rec.drafts_committed != rec.num_accepted or rec.num_accepted != sum(rw.accepted_len):
            problems.append(f"{mode}: committed {rec.drafts_committed} drafts, SCV accepted {rec.num_accepted}, "
                            f"the sampler accepted {sum(rw.accepted_len)}")
            violations.append({"mode": mode, "invariant": "committed-equals-accepted", "tensor": None, "slot": None,
                               "layer": None, "message": f"{mode}: invariant committed-equals-accepted broken: "
                                                         f"{problems[-1][len(mode) + 2:]}"})
        for p in problems[:len(problems) if not violations else 0]:   # a rule the locator does not know
            violations.append({"mode": mode, "invariant": "unlocated", "tensor": None, "slot": None,
                               "layer": None, "message": p})
        results[mode] = {"record": rec.to_dict(), "problems": problems, "violations": violations}
    info = backend(device, config.backend)
    return {
        "ok": all(not r["problems"] and not r["violations"] for r in results.values()),
        "violations": [v for r in results.values() for v in r["violations"]],
        "device": str(device), "backend": info.name, "backend_reason": info.reason,
        "scv_mode": config.scv_mode, "torch": torch.__version__, "seed": seed,
        "window": {"num_reqs": rw.window.num_reqs, "num_tokens": rw.window.num_tokens,
                   "num_draft_tokens": rw.window.num_draft_tokens, "accepted_len": rw.accepted_len},
        "modes": results, "metrics": metrics.summary(),
    }
