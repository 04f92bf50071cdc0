"""Stage's staging blocks (nwor_lab/vllm/staging.py): vLLM's kernel over copies of the window's
blocks gives the lab's torch attention's results (same inputs, float tolerance) and the same
greedy tokens, and the real blocks never see a staged row (the runtime's check=True)."""
import pytest
import torch

from conftest import PROMPTS

MAX_NEW = 24


def test_enlarged_config_keeps_layer_offsets_apart():
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor

    from nwor_lab.vllm.staging import enlarge_kv_cache_config
    page, n, layers = 100, 10, ["a", "b"]
    cfg = KVCacheConfig(num_blocks=n, kv_cache_tensors=[KVCacheTensor(size=page * n * 2, layers=layers,
                                                                     layer_stride=page * n, block_stride=page)],
                        kv_cache_groups=[])
    big = enlarge_kv_cache_config(cfg, 3)
    t = big.kv_cache_tensors[0]
    assert big.num_blocks == 13 and t.layer_stride == page * 13 and t.size == page * 13 * 2 and t.offset == 0
    assert cfg.num_blocks == n and cfg.kv_cache_tensors[0].layer_stride == page * n     # the original untouched


def test_plan_and_fill_place_staged_rows_after_the_real_prefix():
    from types import SimpleNamespace

    from nwor_lab.kv.layout import vllm_cpu_views
    from nwor_lab.vllm.staging import StagingBlocks
    bs, h, d = 32, 2, 4
    packed = torch.randn(8, h, bs, 2 * d)
    real = packed.clone()
    key_view, value_view = vllm_cpu_views(packed)
    # request 0: 30 cached + 3 staged (positions 30..32: blocks 0 and 1), request 1: 5 cached + 2 staged
    md = SimpleNamespace(seq_lens=torch.tensor([33, 7], dtype=torch.int32),
                         query_start_loc=torch.tensor([0, 3, 5], dtype=torch.int32),
                         block_table=torch.tensor([[1, 2], [3, 0]], dtype=torch.int32))
    md = _as_dataclass(md)
    token_req = torch.tensor([0, 0, 0, 1, 1])
    staging = StagingBlocks(5, 3, bs)
    p = staging.plan(token_req, 2, [(0, 5)], md)
    assert p.metadata.block_table.tolist() == [[5, 6], [7, 0]] and md.block_table.tolist() == [[1, 2], [3, 0]]
    assert p.slots.tolist() == [5 * bs + 30, 5 * bs + 31, 6 * bs + 0, 7 * bs + 5, 7 * bs + 6]
    win_k, win_v = torch.randn(5, h, d), torch.randn(5, h, d)

    def write_rows(key, value, slots):          # the lab's index-put (vLLM's op needs head_size >= 32)
        ok = slots >= 0
        key_view[slots[ok] // bs, slots[ok] % bs] = key[ok]
        value_view[slots[ok] // bs, slots[ok] % bs] = value[ok]
    staging.fill(p, packed, write_rows, win_k, win_v)
    assert torch.equal(packed[:5], real[:5])                                   # real blocks untouched
    rk, _ = vllm_cpu_views(real)
    assert torch.equal(key_view[5, :30], rk[1, :30]) and torch.equal(key_view[7, :5], rk[3, :5])
    assert torch.equal(key_view[5, 30:32], win_k[:2]) and torch.equal(key_view[6, 0], win_k[2])
    assert torch.equal(value_view[7, 5:7], win_v[3:5])
    assert staging.plan(token_req, 2, [(0, 5)], _as_dataclass(SimpleNamespace(**{**vars(md), "block_table":
                                                                                 md.block_table[:, :1]}))) is None
    assert StagingBlocks(5, 2, bs).plan(token_req, 2, [(0, 5)], md) is None    # 3 blocks needed, 2 spare
    part = staging.plan(token_req, 2, [(0, 2)], md)         # rows 0, 1 staged so far: request 0 only
    assert part.slots.tolist() == [5 * bs + 31, 6 * bs + 0, -1, -1, -1]
    assert part.metadata.block_table.tolist() == [[5, 6], [3, 0]]


def _as_dataclass(ns):
    from dataclasses import make_dataclass
    cls = make_dataclass("Md", list(vars(ns)))
    return cls(**vars(ns))


@pytest.fixture(scope="module", params=["eagle"])
def lab(request):
    from nwor_lab.vllm.generate import VllmLab
    lab = VllmLab(request.param, 4, check=True, debug=True)
    yield lab
    lab.close()


def test_vllm_kernel_on_staging_blocks_matches_torch_attention(lab, monkeypatch):
    """Every stage pass that the staging blocks serve is also run through the torch path on the
    same inputs: outputs within float tolerance; tokens identical to off and to the torch path."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from nwor_lab.vllm.backend import NworCPUAttentionBackendImpl
    rt = lab.runtime
    assert rt.staging is not None, "the worker allocated no staging blocks"
    compared = []

    def both(self, layer, query, key, value, kv_cache, md, output, *args, **kwargs):
        staged = rt.staged_metadata(layer.layer_name, md) if md is not None else None
        if staged is None:
            return orig(self, layer, query, key, value, kv_cache, md, output, *args, **kwargs)
        CPUAttentionBackendImpl.forward(self, layer, query, key, value, kv_cache, staged, output)
        n = md.num_actual_tokens
        ref = torch.full_like(output, float("nan"))
        keep, rt.staging = rt.staging, None
        try:
            assert rt.attend(layer.layer_name, query[:n], md, self.scale, ref)
        finally:
            rt.staging = keep
        torch.testing.assert_close(output[:n], ref[:n], rtol=1e-4, atol=1e-5)
        compared.append(n)
        return output

    orig = NworCPUAttentionBackendImpl.forward
    monkeypatch.setattr(NworCPUAttentionBackendImpl, "forward", both)
    kernel = lab.generate(PROMPTS, MAX_NEW, nwor_mode="stage")
    monkeypatch.setattr(NworCPUAttentionBackendImpl, "forward", orig)
    assert len(compared) > 0
    keep, rt.staging = rt.staging, None
    try:
        torch_path = lab.generate(PROMPTS, MAX_NEW, nwor_mode="stage")
    finally:
        rt.staging = keep
    off = lab.generate(PROMPTS, MAX_NEW, nwor_mode="off")
    assert kernel.token_ids == torch_path.token_ids == off.token_ids
    for res in (kernel, torch_path):
        assert res.totals["checks_passed"] == len(res.trace) > 0
        assert res.totals["rejected_writes"] == 0
