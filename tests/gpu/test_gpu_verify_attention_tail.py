"""The verify-attention kernel's window tail and query tile on the GPU, at the 8B layer's shape
(8 KV heads, 32 query heads, head size 128, bf16, block size 16), 5-token verify windows.

- stage's window read from the staging buffer gives the bits of the same window committed to the
  cache, with the engine's launch (the caller's query bound: a 32-row tile, no row walk) and the
  old one (64-row tile, row walk, one mixed tail loop), caches ending on a tile boundary or not;
- the split tail (a mixed tile, then window-only tiles) gives the bits of the single tail loop;
- every plan agrees with the torch reference.
Needs CUDA and triton, not the extension."""
import pytest
import torch

from nwor_lab.ops.verify_attention import make_verify_attention_case, verify_attention_reference
from nwor_lab.ops.verify_attention_cases import window_written_to_cache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPE = dict(num_kv_heads=8, num_q_heads=32, head_size=128, dtype=torch.bfloat16, query_lens=5)
NEW = dict(max_query_len=5)                                            # the engine's verify launch
OLD = dict(block_m=64, row_loop=True, split_tail=False)                # the kernel before the split


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton", reason="the kernels need triton: pip install triton")
    from nwor_lab.ops import _verify_attention_triton
    return _verify_attention_triton


def run(kernels, case, **launch):
    a = case.kwargs()
    out = torch.empty(a["q"].shape, dtype=a["q"].dtype, device="cuda")
    kernels.launch(*(a[n] for n in ("q", "key_cache", "value_cache", "block_tables", "cache_lens", "query_start_loc",
                                    "positions", "win_key", "win_value", "win_rows", "win_start")),
                   None, None, a["scale"], out, **launch)
    torch.cuda.synchronize()
    return out


def case_for(batch: int, aligned: bool, seed: int):
    ctx = 1024 if aligned else [1000 + 7 * r % 60 for r in range(batch)]
    return make_verify_attention_case(num_reqs=batch, context_lens=ctx, window=True, window_extra=0, seed=seed,
                                      device="cuda", **SHAPE)


@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("aligned", [True, False], ids=["ctx-aligned", "ctx-unaligned"])
@pytest.mark.parametrize("plan", ["new", "old"])
def test_window_from_the_buffer_equals_the_committed_window(kernels, batch, aligned, plan):
    launch = NEW if plan == "new" else OLD
    case = case_for(batch, aligned, seed=batch + aligned)
    committed = window_written_to_cache(case)
    a, b = run(kernels, case, **launch), run(kernels, committed, **launch)
    assert torch.equal(a, b), float((a.float() - b.float()).abs().max())
    ref = verify_attention_reference(**committed.kwargs())
    torch.testing.assert_close(a.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("batch", [1, 16])
def test_split_tail_gives_the_single_loop_bits(kernels, batch):
    # windows of 5 + 0..3 earlier rows that spill over a tile boundary: mixed tile + window-only tile
    case = make_verify_attention_case(num_reqs=batch, context_lens=[60 + 64 * (r % 5) for r in range(batch)],
                                      window=True, seed=7 + batch, device="cuda", **SHAPE)
    single = run(kernels, case, max_query_len=5, split_tail=False)
    split = run(kernels, case, max_query_len=5, split_tail=True)
    assert torch.equal(single, split)


def test_query_bound_is_checked_and_long_requests_keep_the_row_walk(kernels):
    from nwor_lab.ops.verify_attention import verify_attention
    case = make_verify_attention_case(num_reqs=3, query_lens=[20, 2, 9], max_context=300, window=True, seed=3,
                                      device="cuda", num_kv_heads=2, num_q_heads=8, head_size=128)
    with pytest.raises(ValueError, match="max_query_len=5: a request has 20 query rows"):
        verify_attention(**case.kwargs(), backend="triton", max_query_len=5)
    got = verify_attention(**case.kwargs(), backend="triton", max_query_len=20)
    ref = verify_attention_reference(**case.kwargs())
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=2e-2)
