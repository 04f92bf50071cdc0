"""The engine on the GPU (CUDA extension): every NWOR x SCV mode gives the target-only tokens,
with debug on (committed == accepted by the sampler, every window)."""
import pytest

from nwor_lab import LabConfig
from nwor_lab.engine import generate

pytestmark = pytest.mark.gpu

PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return"]


@pytest.fixture(scope="module")
def reference():
    return generate(PROMPTS, max_new_tokens=32, k=0, config=LabConfig(backend="cuda"), device="cuda").token_ids


@pytest.mark.parametrize("scv", ["off", "graph", "adaptive"])
@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_speculative_equals_target_only(reference, mode, scv):
    cfg = LabConfig(nwor_mode=mode, scv_mode=scv, backend="cuda", debug=True)
    out = generate(PROMPTS, max_new_tokens=32, k=4, config=cfg, device="cuda")
    assert out.token_ids == reference
    assert out.mean_acceptance_length > 1.5



@pytest.mark.parametrize("mode", ["off", "stage"])
def test_gpu_triton_attention_matches_the_torch_reference(mode):
    """fp32: the engine with the Triton verify-attention kernel (the CUDA default) and with the
    torch reference attention decode the same greedy tokens."""
    outs = [generate(PROMPTS, max_new_tokens=24, k=4, device="cuda",
                     config=LabConfig(nwor_mode=mode, backend="cuda", attention=a, debug=True)).token_ids
            for a in ("triton", "torch")]
    assert outs[0] == outs[1]


def test_gpu_bf16_modes_agree_bit_for_bit_with_the_kernel():
    """bf16 through the kernel: stage reads the window from the zero-copy staging buffer, off and
    cow from the cache, and they must see the same bits, so the same tokens."""
    import torch
    outs = {m: generate(PROMPTS, max_new_tokens=24, k=4, device="cuda", dtype=torch.bfloat16,
                        config=LabConfig(nwor_mode=m, backend="cuda", attention="triton", debug=True)).token_ids
            for m in ("off", "cow", "stage")}
    assert outs["off"] == outs["cow"] == outs["stage"]


@pytest.mark.parametrize("k", [0, 4])
def test_gpu_default_config_replays_graphs(k):
    """`SpecEngine(target, head, LabConfig())` on CUDA replays CUDA graphs with nothing set: the defaults
    (SCV graph, cuda_graph) leave no step eager, and `graphed_off` names nothing."""
    from nwor_lab.engine import SpecEngine
    from nwor_lab.model.shipped import load_tiny

    target, head, tok = load_tiny(device="cuda")
    engine = SpecEngine(target, head, LabConfig(), k=k, max_num_seqs=4)
    reqs = [engine.add_request(tok.encode(p).ids, 24) for p in PROMPTS]
    engine.run()
    assert engine.graphed_off is None
    assert engine.runner.graphed_steps > 0 and engine.runner.replays > 0
    assert all(len(r.output) == 24 for r in reqs)


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
@pytest.mark.parametrize("k", [0, 4])
def test_gpu_graphed_steps_decode_what_eager_steps_do(mode, k):
    """Steps replayed from CUDA graphs (LabConfig.cuda_graph, the CUDA default; SCV graph) give the
    tokens and records of the same body run eagerly; the graphs were really captured and replayed."""
    from nwor_lab.engine import SpecEngine
    from nwor_lab.model.shipped import load_tiny

    target, head, tok = load_tiny(device="cuda")
    outs, records = {}, {}
    for graphs in (False, True):
        engine = SpecEngine(target, head, LabConfig(nwor_mode=mode, scv_mode="graph", backend="cuda", cuda_graph=graphs),
                            k=k,
                            max_num_seqs=4)
        reqs = [engine.add_request(tok.encode(p).ids, 40) for p in PROMPTS + PROMPTS[:1]]
        engine.run()
        outs[graphs] = [r.output for r in reqs]
        records[graphs] = [(t.kind, t.record.to_dict()) for t in engine.trace]
        if graphs:
            r = engine.runner
            assert r.replays > 0 and any(b.graph is not None for b in r.buckets.values())
            assert r.prelaunched > 0     # steps launched before the host read the one before
            if k:   # the draft chain rode in the verify graph
                assert all(b.chain is not None for b in r.buckets.values())
        else:
            assert engine.runner.replays == 0 and not engine.runner.buckets
    assert outs[True] == outs[False]
    assert records[True] == records[False]     # replayed windows get the records their commits make
