"""fp8 saturation on the GPU: the write_kv and commit kernels (`__NV_SATFINITE`) store +-fmax for
values beyond the format's maximum, exactly as the torch reference (`clamp` then convert) does.

Cases: `generators.saturating_cases` (e4m3 and e5m2, scalar and per-head scales in every form the
ops accept, fp32/fp16/bf16 sources incl. inf, NHD and HND), compared byte for byte with the CPU
reference and with the bytes of +-fmax computed independently (tests/test_fp8_saturation.py
does the same on the CPU). Then the write policies on CUDA with backend `cuda`.
"""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv.cache import FP8_MAX
from nwor_lab.ops.commit import commit_reference
from nwor_lab.ops.generators import saturating_cases, to_device
from nwor_lab.ops.quant import raw
from nwor_lab.ops.write_kv import write_kv_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CASES = list(saturating_cases(device="cpu")) if torch.cuda.is_available() else []
IDS = [c.name for c in CASES]


def expected_bytes(x, scale, fp8):
    """+-fmax where |x / scale| >= fmax (inf included), else round to nearest even; on the CPU."""
    fmax = FP8_MAX[fp8]
    q = x.float().cpu() / scale.reshape(-1).cpu()[:, None]
    inside = q.abs() < fmax
    plain = torch.where(inside, q, torch.zeros_like(q)).to(fp8)
    at_max = torch.where(q > 0, torch.tensor(fmax), torch.tensor(-fmax)).to(fp8)
    return torch.where(inside, raw(plain), raw(at_max))


def assert_same_bytes(got, want, what):
    g, w = raw(got).cpu(), raw(want).cpu()
    if not torch.equal(g, w):
        bad = (g != w).nonzero()
        first = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {bad.shape[0]} bytes differ, first at {first}: got {int(g[first]) & 0xff:#04x} "
                             f"want {int(w[first]) & 0xff:#04x}")


def assert_rows_saturated(cache_layer, x, scale, slots, rows, what):
    """Cache rows at slots[rows] hold exactly the saturated quantisation of x[rows]."""
    bs = cache_layer.shape[1]
    s = slots.cpu()[rows.cpu()].long()
    got = cache_layer.cpu()[s // bs, s % bs]              # fp8 indexing on the CPU (complete there)
    x, rows = x.cpu(), rows.cpu()
    assert not torch.isinf(got.float()).any() and not torch.isnan(got.float()).any(), f"{what}: inf/NaN stored"
    assert_same_bytes(got, expected_bytes(x[rows], scale, cache_layer.dtype), what)


def scale_forms(ks, vs):
    """[H] per head, a stride-0 expanded view, and a 0-d scalar where every head has one scale."""
    forms = [("per_head", ks, vs), ("expanded", ks[:1].expand(ks.shape[0]), vs[:1].expand(vs.shape[0]))]
    if bool((ks == ks[0]).all()) and bool((vs == vs[0]).all()):
        forms.append(("scalar", ks[0], vs[0]))
    return forms


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_write_kv_kernel_saturates(ext, case):
    case = to_device(case, "cuda")
    cache = case.cache
    rows = torch.nonzero(case.slot_mapping >= 0).flatten()
    for layer in range(cache.num_layers):
        ks_full, vs_full = cache.layer_scales(layer)
        for form, ks, vs in scale_forms(ks_full, vs_full):
            if form == "expanded" and not bool((ks_full == ks_full[0]).all()):
                continue                    # an expanded view means one scale for all heads
            got_k, got_v = cache.key[layer].clone(), cache.value[layer].clone()
            ext.write_kv(case.key[layer], case.value[layer], got_k, got_v, case.slot_mapping, ks, vs)
            want_k, want_v = cache.key[layer].cpu().clone(), cache.value[layer].cpu().clone()
            write_kv_reference(case.key[layer].cpu(), case.value[layer].cpu(), want_k, want_v,
                               case.slot_mapping.cpu(), ks.cpu(), vs.cpu())
            what = f"{case.name} layer {layer} scales {form}"
            assert_same_bytes(got_k, want_k, f"key vs reference, {what}")
            assert_same_bytes(got_v, want_v, f"value vs reference, {what}")
            assert_rows_saturated(got_k, case.key[layer], ks_full, case.slot_mapping, rows, f"key, {what}")
            assert_rows_saturated(got_v, case.value[layer], vs_full, case.slot_mapping, rows, f"value, {what}")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_commit_kernel_saturates(ext, case):
    case = to_device(case, "cuda")
    cache = case.cache
    got_k, got_v = cache.key.clone(), cache.value.clone()
    ext.commit(case.key, case.value, got_k, got_v, case.slot_mapping, case.commit_mask, cache.k_scale, cache.v_scale)
    want_k, want_v = cache.key.cpu().clone(), cache.value.cpu().clone()
    commit_reference(case.key.cpu(), case.value.cpu(), want_k, want_v, case.slot_mapping.cpu(),
                     case.commit_mask.cpu(), cache.k_scale.cpu(), cache.v_scale.cpu())
    assert_same_bytes(got_k, want_k, f"key vs reference, {case.name}")
    assert_same_bytes(got_v, want_v, f"value vs reference, {case.name}")
    rows = torch.nonzero((case.slot_mapping >= 0) & case.commit_mask).flatten()
    for layer in range(cache.num_layers):
        assert_rows_saturated(got_k[layer], case.key[layer], cache.k_scale[layer], case.slot_mapping, rows,
                              f"key layer {layer}, {case.name}")
        assert_rows_saturated(got_v[layer], case.value[layer], cache.v_scale[layer], case.slot_mapping, rows,
                              f"value layer {layer}, {case.name}")


def test_nan_stays_nan_in_kernel_and_reference(ext):
    """NaN is not saturated by either (satfinite keeps NaN; clamp keeps NaN); both store a NaN."""
    case = to_device(next(c for c in CASES if c.meta["cache_dtype"] == "fp8_e5m2"), "cuda")
    cache = case.cache
    key = case.key[0].clone()
    key[:, 0, 0] = float("nan")
    ks, vs = cache.layer_scales(0)
    got_k, got_v = cache.key[0].clone(), cache.value[0].clone()
    ext.write_kv(key, case.value[0], got_k, got_v, case.slot_mapping, ks, vs)
    want_k, want_v = cache.key[0].cpu().clone(), cache.value[0].cpu().clone()
    write_kv_reference(key.cpu(), case.value[0].cpu(), want_k, want_v, case.slot_mapping.cpu(), ks.cpu(), vs.cpu())
    assert torch.equal(torch.isnan(got_k.float()).cpu(), torch.isnan(want_k.float()))


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_write_policies_on_cuda_saturate(ext, mode, fmt):
    """The engine's path on the GPU (backend cuda): one prefill window, every row committed."""
    from nwor_lab.policies import make_policy
    from nwor_lab.window import Window

    case = to_device(next(c for c in CASES if c.meta["cache_dtype"] == fmt and c.meta["dtype"] == torch.bfloat16),
                     "cuda")
    cache = case.cache
    t = case.key.shape[1]
    slots = torch.randperm(cache.num_slots, generator=torch.Generator().manual_seed(0))[:t].cuda()
    policy = make_policy(LabConfig(nwor_mode=mode, backend="cuda"), cache)
    window = Window.from_counts([t], [0], slots)
    policy.begin(window)
    for layer in range(cache.num_layers):
        policy.write(layer, case.key[layer], case.value[layer])
    policy.commit(None)
    torch.cuda.synchronize()
    rows = torch.arange(t, device="cuda")
    for layer in range(cache.num_layers):
        k_cache, v_cache = cache.layer(layer)
        ks, vs = cache.layer_scales(layer)
        assert_rows_saturated(k_cache, case.key[layer], ks, slots, rows, f"{mode} key layer {layer}")
        assert_rows_saturated(v_cache, case.value[layer], vs, slots, rows, f"{mode} value layer {layer}")
