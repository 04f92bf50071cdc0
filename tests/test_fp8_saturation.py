"""fp8 caches saturate: a value beyond the format's maximum is stored as +-fmax, never inf or NaN.

Quantisation is `fp8(clamp(x / scale, -fmax, fmax))` (docs/architecture.md); the CUDA kernels use
`__NV_SATFINITE`, which is the same. Without the clamp torch stores inf for e5m2 (1e6 -> inf, not
57344) and NaN for e4m3fn, and the reference would disagree with the kernels. Cases come from
`generators.saturating_cases` (both formats, scalar and per-head scales, every source dtype,
values from inside the range to far beyond it and inf, both signs); the expected bytes are
computed here independently of `quant.quantize`. tests/gpu/test_gpu_saturation.py runs the same
cases through the kernels.
"""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv.cache import CACHE_DTYPES, FP8_MAX
from nwor_lab.ops import commit, write_kv
from nwor_lab.ops.generators import saturating_cases
from nwor_lab.ops.quant import dequantize, quantize, raw
from nwor_lab.policies import make_policy
from nwor_lab.window import Window

CASES = list(saturating_cases())
IDS = [c.name for c in CASES]


def expected_bytes(x: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """Raw fp8 bytes of `x [n, H, D]` with `scale [H]`: +-fmax where |x / scale| >= fmax (inf
    included), else plain round-to-nearest-even (in range, where torch's conversion is exact)."""
    fmax = FP8_MAX[fp8]
    q = x.float() / scale.reshape(-1)[:, None]
    inside = q.abs() < fmax
    plain = torch.where(inside, q, torch.zeros_like(q)).to(fp8)
    at_max = torch.where(q > 0, torch.tensor(fmax), torch.tensor(-fmax)).to(fp8)
    return torch.where(inside, raw(plain), raw(at_max))


def rows_of(cache_tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`[NB, BS, H, D]` cache rows at `slots` (valid slots only)."""
    bs = cache_tensor.shape[1]
    return cache_tensor[slots // bs, slots % bs]


def assert_saturated(cache_layer: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, slots: torch.Tensor,
                     rows: torch.Tensor, what: str) -> None:
    got = rows_of(cache_layer, slots[rows].long())
    want = expected_bytes(x[rows], scale, cache_layer.dtype)
    assert not torch.isnan(got.float()).any() and not torch.isinf(got.float()).any(), \
        f"{what}: an fp8 value was stored as inf/NaN (saturation clamp missing)"
    if not torch.equal(raw(got), want):
        bad = (raw(got) != want).nonzero()[0].tolist()
        r, h, d = bad
        raise AssertionError(f"{what}: row {int(rows[r])} head {h} dim {d}: x={x[rows][r, h, d].item()!r} "
                             f"scale={scale.reshape(-1)[h if scale.numel() > 1 else 0].item()} stored "
                             f"{got[r, h, d].float().item()} (0x{int(raw(got)[r, h, d]) & 0xff:02x}), want "
                             f"0x{int(want[r, h, d]) & 0xff:02x}")


@pytest.mark.parametrize("fmt,fmax", [("fp8_e4m3", 448.0), ("fp8_e5m2", 57344.0)])
def test_far_beyond_the_maximum_stores_the_maximum(fmt, fmax):
    fp8 = CACHE_DTYPES[fmt][0]
    x = torch.tensor([1e6, -1e6, float("inf"), float("-inf"), 1.5 * fmax, -1.5 * fmax, fmax, -fmax, 1.0])
    q = quantize(x.reshape(-1, 1, 1), fp8, torch.tensor(1.0)).float().flatten()
    assert q.tolist() == [fmax, -fmax, fmax, -fmax, fmax, -fmax, fmax, -fmax, 1.0]
    # per-head scales: head 1's scale is small enough that an ordinary value saturates there only
    y = torch.full((2, 2, 4), 64.0)
    y[1] = -64.0
    scales = torch.tensor([1.0, 64.0 / (4 * fmax)])
    q = dequantize(quantize(y, fp8, scales), torch.float32, scales)
    assert torch.equal(q[:, 0], y[:, 0])
    assert torch.equal(q[:, 1], torch.sign(y[:, 1]) * torch.full((2, 4), fmax) * scales[1])


def test_the_generator_reaches_the_fp8_maximum():
    assert {c.meta["cache_dtype"] for c in CASES} == {"fp8_e4m3", "fp8_e5m2"}
    for c in CASES:
        fmax = CACHE_DTYPES[c.meta["cache_dtype"]][1]
        for x, s in ((c.key, c.cache.k_scale), (c.value, c.cache.v_scale)):
            q = x.float() / s[:, None, :, None]
            finite = q[torch.isfinite(q)]
            assert finite.abs().max() > 10 * fmax and torch.isinf(q).any(), c.name   # far beyond
            assert (q > fmax).any() and (q < -fmax).any(), c.name               # both signs
            assert ((q.abs() > 0.5 * fmax) & (q.abs() < fmax)).any(), c.name    # just inside too
            assert (q.abs() < 0.01 * fmax).any(), c.name                         # ordinary values
    assert any(c.cache.k_scale[0].unique().numel() > 1 for c in CASES)           # per-head scales
    assert any(c.meta["dtype"] == torch.float16 and torch.isinf(c.key.float()).any() for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_write_kv_saturates(case):
    cache = case.cache
    rows = torch.nonzero(case.slot_mapping >= 0).flatten()
    for layer in range(cache.num_layers):
        k_cache, v_cache = cache.layer(layer)
        ks, vs = cache.layer_scales(layer)
        forms = [(ks, vs)] + ([(ks[0], vs[0])] if bool((ks == ks[0]).all() & (vs == vs[0]).all()) else [])
        for form_k, form_v in forms:       # per-head [H], and a 0-d scalar where all heads agree
            kc, vc = k_cache.clone(), v_cache.clone()
            write_kv(case.key[layer], case.value[layer], kc, vc, case.slot_mapping, form_k, form_v)
            assert_saturated(kc, case.key[layer], ks, case.slot_mapping, rows, f"{case.name} key layer {layer}")
            assert_saturated(vc, case.value[layer], vs, case.slot_mapping, rows, f"{case.name} value layer {layer}")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_commit_saturates(case):
    cache = case.cache
    key, value = cache.key.clone(), cache.value.clone()
    commit(case.key, case.value, key, value, case.slot_mapping, case.commit_mask, cache.k_scale, cache.v_scale)
    rows = torch.nonzero((case.slot_mapping >= 0) & case.commit_mask).flatten()
    for layer in range(cache.num_layers):
        assert_saturated(key[layer], case.key[layer], cache.k_scale[layer], case.slot_mapping, rows, f"key {layer}")
        assert_saturated(value[layer], case.value[layer], cache.v_scale[layer], case.slot_mapping, rows,
                         f"value {layer}")


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_every_write_policy_saturates(mode, fmt):
    """The path the engine takes: a window of one prefill through the policy, every row committed."""
    case = next(c for c in CASES if c.meta["cache_dtype"] == fmt and c.meta["dtype"] == torch.bfloat16)
    cache = case.cache
    slots = torch.randperm(cache.num_slots, generator=torch.Generator().manual_seed(0))[:case.key.shape[1]]
    policy = make_policy(LabConfig(nwor_mode=mode), cache)
    window = Window.from_counts([slots.numel()], [0], slots)
    policy.begin(window)
    for layer in range(cache.num_layers):
        policy.write(layer, case.key[layer], case.value[layer])
    policy.commit(None)
    rows = torch.arange(slots.numel())
    for layer in range(cache.num_layers):
        k_cache, v_cache = cache.layer(layer)
        ks, vs = cache.layer_scales(layer)
        assert_saturated(k_cache, case.key[layer], ks, slots, rows, f"{mode} key layer {layer}")
        assert_saturated(v_cache, case.value[layer], vs, slots, rows, f"{mode} value layer {layer}")
