"""nwor_lab.ops.fused: RMSNorm, RoPE and silu*up as one Triton kernel each, and nwor_lab.ops.softmax
(the sampler's softmax at a temperature), against the torch references (the model's own math), under
Triton's CPU interpreter in a subprocess (tests/fused_interp.py); the dispatch rules in this process.
The kernels on CUDA: tests/gpu."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nwor_lab.ops import fused

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    pytest.importorskip("triton", reason="triton is not installed: the kernels run on CPU under its interpreter")
    out = tmp_path_factory.mktemp("fused") / "res.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(HERE / "fused_interp.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        pytest.fail(f"interpreter worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def test_rope_gives_torchs_bits_in_every_dtype(interp):
    """Each product and the sum are rounded where torch rounds them: the same bits, also into
    `out` (the zero-copy staging buffer)."""
    cases = {k: v for k, v in interp.items() if k.startswith("rope")}
    assert len(cases) == 24
    for name, r in cases.items():
        if "float32" in name:
            assert r["max_ulp"] <= 1, name        # fp32: a fused multiply-add may round once, not twice
        else:
            assert r["exact"], (name, r)


def test_rms_norm_matches_the_reference_to_an_ulp(interp):
    cases = {k: v for k, v in interp.items() if k.startswith("rms_norm")}
    assert len(cases) == 12
    for name, r in cases.items():
        assert r["max_ulp"] <= (4 if "float32" in name else 1), (name, r)   # only the sum's order differs


def test_silu_mul_matches_the_reference(interp):
    cases = {k: v for k, v in interp.items() if k.startswith("silu_mul")}
    assert len(cases) == 9
    for name, r in cases.items():
        assert r["max_ulp"] <= (64 if "float32" in name else 1), (name, r)  # exp implementations differ


def test_references_are_the_models_math_and_cpu_takes_them():
    """Without the interpreter, CPU tensors run the references: the model's numbers on CPU are
    what they always were."""
    x = torch.randn(4, 2, 8)
    cos, sin = torch.rand(4, 8), torch.rand(4, 8)
    assert not fused.use_fused(x) or os.environ.get("TRITON_INTERPRET") == "1"
    half = 4
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    assert torch.equal(fused.rope(x, cos, sin), x * cos[:, None] + rot * sin[:, None])
    w = torch.rand(8)
    xf = x.reshape(-1, 8)
    want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.equal(fused.rms_norm(xf, w, 1e-6), want)


def test_autograd_keeps_the_reference():
    """Training (grad recorded) must not reach a kernel without a backward."""
    x = torch.randn(3, 8, requires_grad=True)
    assert not fused.use_fused(x)
    fused.rms_norm(x, torch.ones(8), 1e-6).sum().backward()
    assert x.grad is not None


def test_temperature_softmax_matches_the_reference_within_fp32_ulps(interp):
    """Chunked rows (a tail, a chunk of -inf logits, per-row and scalar temperatures), every logits dtype:
    fp32 probabilities within 2e-6 relative of torch's, rows still summing to 1, no NaN."""
    cases = {k: v for k, v in interp.items() if k.startswith("softmax")}
    assert len(cases) == 15
    for name, c in cases.items():
        assert c["dtype"] == "torch.float32" and c["max_rel"] <= 2e-6, (name, c)


def test_temperature_softmax_names_a_bad_temperature_and_cpu_takes_the_reference():
    from nwor_lab.ops import softmax
    x = torch.randn(3, 50).to(torch.bfloat16)
    assert torch.equal(softmax.temperature_softmax(x, 0.5), torch.softmax(x.float() / 0.5, -1))
    f = torch.randn(3, 50)
    kept = f.clone()
    softmax.temperature_softmax(f, torch.full((3,), 0.5))
    assert torch.equal(f, kept)                     # fp32 logits: .float() is the tensor itself, left unscaled
    with pytest.raises(ValueError, match="temperature=0"):
        softmax.temperature_softmax(x, 0.0)
    with pytest.raises(ValueError, match="temperature"):
        softmax.temperature_softmax(x, torch.ones(2))
    with pytest.raises(TypeError, match="temperature"):
        softmax.temperature_softmax(x, torch.ones(3, dtype=torch.float64))


def test_bench_softmax_says_it_needs_cuda_and_checks_its_arguments():
    from nwor_lab.bench import softmax as bench_softmax
    from nwor_lab.commandline.errors import UsageError
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the bench would run")
    with pytest.raises(UsageError, match="no CUDA device"):
        bench_softmax.main(["--rows", "4"])
    with pytest.raises(UsageError, match="--reps"):
        bench_softmax.main(["--reps", "1"])
