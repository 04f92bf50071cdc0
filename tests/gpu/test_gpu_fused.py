"""nwor_lab.ops.fused on CUDA: the Triton RMSNorm, RoPE and silu*up against the torch references,
taken by the model at inference; under a CUDA graph too."""
import pytest
import torch

from nwor_lab.ops import fused

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def ulps(a, b):
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[a.dtype]
    ia, ib = a.view(bits).long(), b.view(bits).long()
    top = 1 << (8 * a.element_size() - 1)
    ia, ib = torch.where(ia < 0, -(ia + top), ia), torch.where(ib < 0, -(ib + top), ib)
    return int((ia - ib).abs().max()) if a.numel() else 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", [(5, 256), (40, 4096), (3, 100), (1, 64)])
def test_gpu_rms_norm(dtype, n, d):
    x = (torch.randn(n, d, device="cuda") * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(d, device="cuda")).to(dtype)
    assert fused.use_fused(x, w)
    got, want = fused.rms_norm(x, w, 1e-5), fused.rms_norm_reference(x, w, 1e-5)
    # only the fp32 sum of squares' order differs: normalised x may land one ulp off in its dtype,
    # and the weight's product rounds once more
    assert got.dtype == want.dtype and ulps(got, want) <= (8 if dtype == torch.float32 else 2), ulps(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h,d", [(5, 4, 64), (40, 32, 128), (7, 8, 128), (3, 3, 32)])
def test_gpu_rope(dtype, t, h, d):
    x = torch.randn(t, h, d, device="cuda").to(dtype)
    pos = torch.randint(0, 4000, (t,), device="cuda").float()
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device="cuda").float() / d)
    emb = torch.cat([pos[:, None] * inv] * 2, -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    want = fused.rope_reference(x, cos, sin)
    out = torch.full_like(x, float("nan"))
    got = fused.rope(x, cos, sin, out=out)
    assert got.data_ptr() == out.data_ptr()
    # Under the interpreter the kernel gives torch's bits (tests/test_fused.py). Compiled for an
    # H100 a product can round one ulp apart, and where x*cos and rot*sin cancel that is many ulps
    # of the small result: the error is bounded by the terms' scale, |x| (|cos|, |sin| <= 1)
    err = (got.float() - want.float()).abs()
    scale = x.float().abs().amax(-1, keepdim=True)        # per (token, head)
    assert bool((err <= 2 * torch.finfo(dtype).eps * scale).all()), float((err / scale).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 768), (64, 14336), (3, 1000)])
def test_gpu_silu_mul(dtype, shape):
    g = (torch.randn(*shape, device="cuda") * 4).to(dtype)
    u = torch.randn(*shape, device="cuda").to(dtype)
    got, want = fused.silu_mul(g, u), fused.silu_mul_reference(g, u)
    # exp implementations differ: silu lands an ulp off, the product rounds once more
    assert ulps(got, want) <= (64 if dtype == torch.float32 else 2), ulps(got, want)


def test_gpu_model_layer_uses_them_and_captures():
    """A decoder layer at inference: the fused ops replay inside a CUDA graph to the eager bits."""
    from nwor_lab.model.config import LlamaConfig
    from nwor_lab.model.llama import LlamaDecoderLayer
    from nwor_lab.ops.graphs import capture_graph
    cfg = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=768, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    layer = LlamaDecoderLayer(cfg).cuda().to(torch.bfloat16).eval()
    x = torch.randn(5, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = layer.mlp(layer.post_attention_layernorm(x))
        static = {}
        graph = capture_graph(lambda: static.setdefault("y", layer.mlp(layer.post_attention_layernorm(x))))
        graph.replay()
    assert torch.equal(static["y"], eager)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,v", [(64, 128256), (3, 10000), (5, 4096)])
def test_gpu_temperature_softmax(dtype, n, v):
    """The sampler's softmax (nwor_lab.ops.softmax) against torch's at per-row temperatures: within
    2e-5 relative where torch's probability exceeds 1e-20 (Triton's exp is an ex2 of x log2 e), rows
    summing to 1, a chunk of -inf logits adding nothing; and replayed in a CUDA graph, to its eager bits."""
    from nwor_lab.ops import softmax
    from nwor_lab.ops.graphs import capture_graph
    x = (torch.randn(n, v, device="cuda") * 4).to(dtype)
    cut = 4096 if v > 4096 else v // 2           # a whole chunk of -inf where the row has more than one
    x[0, :cut] = float("-inf")
    t = torch.linspace(0.3, 1.5, n, device="cuda")
    got, want = softmax.temperature_softmax(x, t), softmax.temperature_softmax_reference(x, t)
    big = want > 1e-20
    assert got.dtype == torch.float32 and not got.isnan().any()
    assert float(((got - want).abs()[big] / want[big]).max()) <= 2e-5
    assert float((got.sum(-1) - 1).abs().max()) <= 1e-5 and float(got[0, :cut].abs().max()) == 0.0
    assert torch.equal(softmax.temperature_softmax(x, t), got)          # the input is left as it was
    static = {}
    graph = capture_graph(lambda: static.update(p=softmax.temperature_softmax(x, t)))     # the captured output
    static["p"].zero_()
    graph.replay()
    assert torch.equal(static["p"], got)
