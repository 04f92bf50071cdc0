"""Write policies on the GPU through the CUDA extension equal the CPU reference bit for bit.

Skipped without CUDA (CI); run on the lent H100/H200 (`pytest -m gpu`)."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.policies import make_policy
from nwor_lab.speculative import ScvRunner
from nwor_lab.window import Window
from nwor_lab.policies.invariants import RandomWindow, random_window, run_window
from nwor_lab.ops.quant import raw
from nwor_lab.selfcheck import selfcheck

pytestmark = pytest.mark.gpu


def _to(rw: RandomWindow, dev) -> RandomWindow:
    w = rw.window
    win = Window.from_counts(w.num_scheduled_tokens, w.num_draft_tokens, w.slot_mapping.to(dev),
                             w.draft_token_ids.to(dev))
    return RandomWindow(win, rw.key.to(dev), rw.value.to(dev), rw.accepted_len, rw.draft_mask.to(dev),
                        rw.sampled_token_ids.to(dev))


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
@pytest.mark.parametrize("scv_mode", ["off", "graph", "adaptive"])
def test_gpu_policy_equals_cpu_reference(mode, layout, cache_dtype, scv_mode):
    spec = KVCacheSpec(4, 64, 16, 8, 128, torch.bfloat16, cache_dtype, layout)
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        results = {}
        for dev, backend in (("cpu", "torch"), ("cuda", "cuda")):
            cache = PagedKVCache(spec, dev)
            g = torch.Generator().manual_seed(seed)
            cache.key.copy_(torch.randn(cache.key.shape, generator=g).to(spec.storage_dtype))
            cache.value.copy_(torch.randn(cache.value.shape, generator=g).to(spec.storage_dtype))
            if cache.is_fp8:
                cache.k_scale.copy_(0.01 + 0.05 * torch.rand(4, 8, generator=g))
                cache.v_scale.copy_(cache.k_scale * 2)
            if dev == "cpu":
                rw = random_window(cache, gen, num_reqs=16, max_k=8)
            policy = make_policy(LabConfig(nwor_mode=mode, scv_mode=scv_mode, backend=backend), cache)
            rw_dev = rw if dev == "cpu" else _to(rw, dev)
            acceptance = ScvRunner(scv_mode).accept(rw_dev.window, rw_dev.sampled_token_ids)
            rec = run_window(policy, rw_dev, chunks=2, acceptance=acceptance)
            results[dev] = (cache, rec)
        (ccpu, rcpu), (cgpu, rgpu) = results["cpu"], results["cuda"]
        assert torch.equal(raw(ccpu.key), raw(cgpu.key).cpu()) and torch.equal(raw(ccpu.value), raw(cgpu.value).cpu())
        assert rcpu.to_dict() == rgpu.to_dict()


def test_gpu_selfcheck_with_cuda_backend():
    for scv in ("off", "graph", "adaptive"):
        result = selfcheck(LabConfig(scv_mode=scv, backend="cuda"), device="cuda")
        assert result["ok"] and result["backend"] == "cuda", result
