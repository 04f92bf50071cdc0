"""The batched torch verify attention (what the vLLM plugin's stage attention runs) equals the
per-request reference on random batches: GQA, layouts incl. vLLM's CPU one, window rows, empty
query rows, fp32 and bf16."""
import pytest
import torch

from nwor_lab.kv.layout import vllm_cpu_views
from nwor_lab.ops.verify_attention import verify_attention_reference
from nwor_lab.ops.verify_attention_batched import verify_attention_batched
from nwor_lab.ops.verify_attention_cases import make_verify_attention_case

CASES = [dict(window=w, layout=l, dtype=dt, num_q_heads=hq, seed=s)
         for s, (w, l, dt, hq) in enumerate([(False, "NHD", torch.float32, 8), (True, "NHD", torch.float32, 2),
                                             (True, "HND", torch.float32, 8), (True, "NHD", torch.bfloat16, 8),
                                             (False, "HND", torch.bfloat16, 2), (True, "HND", torch.float32, 4)])]


@pytest.mark.parametrize("params", CASES, ids=lambda p: "-".join(str(v) for v in p.values()))
def test_equals_the_reference(params):
    case = make_verify_attention_case(num_reqs=5, max_context=70, block_size=16, **params)
    kw = case.kwargs()
    kw.pop("k_scale"), kw.pop("v_scale")
    ref = verify_attention_reference(**kw)
    got = verify_attention_batched(**kw)
    tol = 1e-5 if case.q.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)


def test_requests_without_queries_and_the_vllm_cpu_layout():
    case = make_verify_attention_case(num_reqs=4, query_lens=[3, 0, 5, 1], block_size=32, window=True,
                                      dtype=torch.float32, seed=9)
    kw = case.kwargs()
    kw.pop("k_scale"), kw.pop("v_scale")
    nb, bs, h, d = case.key_cache.shape
    packed = torch.zeros(nb, h, bs, 2 * d)
    k, v = vllm_cpu_views(packed)
    k.copy_(case.key_cache), v.copy_(case.value_cache)
    kw["key_cache"], kw["value_cache"] = k, v
    out = torch.full_like(case.q, float("nan"))
    verify_attention_batched(**kw, out=out)
    torch.testing.assert_close(out, verify_attention_reference(**kw), atol=1e-5, rtol=1e-5)
    assert not torch.isnan(out).any()


def test_fp8_is_left_to_the_reference():
    case = make_verify_attention_case(num_reqs=2, cache_dtype="fp8_e4m3", seed=1)
    kw = case.kwargs()
    kw.pop("k_scale"), kw.pop("v_scale")
    with pytest.raises(ValueError, match="fp8 caches go through verify_attention_reference"):
        verify_attention_batched(**kw)
