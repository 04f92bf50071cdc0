"""Run nwor_lab.ops.fused's Triton kernels under Triton's CPU interpreter against the references.

    TRITON_INTERPRET=1 python tests/fused_interp.py <results.json>

A separate process: the interpreter must be on before triton is first imported (tests/test_fused.py
starts this one). results.json: {case id: {"max_abs": .., "max_ulp": .., "exact": bool}}.
"""
from __future__ import annotations

import json
import sys


def ulps(a, b):
    """Largest distance between a and b in units of the last place of their dtype."""
    import torch
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[a.dtype]
    ia, ib = a.view(bits).long(), b.view(bits).long()
    # sign-magnitude -> a monotonic integer line
    top = 1 << (8 * a.element_size() - 1)
    ia = torch.where(ia < 0, -(ia + top), ia)
    ib = torch.where(ib < 0, -(ib + top), ib)
    return int((ia - ib).abs().max()) if a.numel() else 0


def main(out_path: str) -> None:
    import torch
    from nwor_lab.ops import fused
    from nwor_lab.ops import _fused_triton as kernels
    assert kernels.INTERPRETED, "run with TRITON_INTERPRET=1"
    gen = torch.Generator().manual_seed(0)
    res = {}

    def record(name, got, want):
        res[name] = {"max_abs": float((got.float() - want.float()).abs().max()) if got.numel() else 0.0,
                     "max_ulp": ulps(got, want), "exact": bool(torch.equal(got, want)),
                     "shape": list(got.shape), "dtype": str(got.dtype)}

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        dn = str(dtype).split(".")[-1]
        for n, d in ((5, 256), (3, 100), (1, 64), (0, 64)):
            x = (torch.randn(n, d, generator=gen) * 3).to(dtype)
            w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
            record(f"rms_norm-{dn}-{n}x{d}", fused.rms_norm(x, w, 1e-5), fused.rms_norm_reference(x, w, 1e-5))
        for t, h, d in ((5, 4, 64), (3, 2, 64), (2, 3, 32), (0, 2, 64)):
            x = torch.randn(t, h, d, generator=gen).to(dtype)
            pos = torch.randint(0, 1000, (t,), generator=gen).float()
            inv = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
            emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)
            cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
            record(f"rope-{dn}-{t}x{h}x{d}", fused.rope(x, cos, sin), fused.rope_reference(x, cos, sin))
            out = torch.full_like(x, float("nan"))
            fused.rope(x, cos, sin, out=out)
            record(f"rope_out-{dn}-{t}x{h}x{d}", out, fused.rope_reference(x, cos, sin))
        for shape in ((5, 768), (3, 1000), (0, 8)):
            g = (torch.randn(*shape, generator=gen) * 4).to(dtype)
            u = torch.randn(*shape, generator=gen).to(dtype)
            record(f"silu_mul-{dn}-{'x'.join(map(str, shape))}", fused.silu_mul(g, u), fused.silu_mul_reference(g, u))
        # the sampler's softmax at a temperature: chunks of 4096 columns, a tail, a chunk of -inf logits
        from nwor_lab.ops import softmax
        for n, v in ((3, 10000), (2, 4096), (1, 5), (0, 100)):
            x = (torch.randn(n, v, generator=gen) * 4).to(dtype)
            if n == 3:
                x[1, :4096] = float("-inf")
            t = torch.tensor([0.5, 0.8, 1.3][:n])
            got, want = softmax.temperature_softmax(x, t), softmax.temperature_softmax_reference(x, t)
            record(f"softmax-{dn}-{n}x{v}", got, want)
            res[f"softmax-{dn}-{n}x{v}"]["max_rel"] = float(((got - want).abs() / want.clamp_min(1e-30)).max()) \
                if n else 0.0
        x = (torch.randn(2, 300, generator=gen) * 4).to(dtype)
        got, want = softmax.temperature_softmax(x, 0.7), softmax.temperature_softmax_reference(x, 0.7)
        record(f"softmax_scalar-{dn}", got, want)
        res[f"softmax_scalar-{dn}"]["max_rel"] = float(((got - want).abs() / want.clamp_min(1e-30)).max())
    json.dump(res, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
