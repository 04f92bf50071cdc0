"""The hand-off through CUDA IPC on one GPU (nwor_lab.disagg.ipc; written without a GPU: unverified
until this runs). Two processes, both engines on cuda:0, the shipped pair:

- every exact strategy's decode engine emits one engine's tokens, greedy and seeded T > 0 (the
  sampler's stream travels), under write-all (`off`) and `stage`; `nwor` keeps one engine's acceptance;
- the rows arrive on the GPU: the shipment's K/V tensors on the decode side are CUDA tensors (no host
  copy on the way), and the control channel carries far fewer bytes than the K/V;
- a CPU device is refused by name."""
import pytest
import torch

from nwor_lab.config import LabConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["Once upon a time, there was a little girl named Lily. She", "The cat sat on the mat and"]
NEW = 16


@pytest.fixture(scope="module")
def prompts():
    from nwor_lab.model.shipped import load_tiny
    _, _, tok = load_tiny()
    return [tok.encode(t).ids for t in PROMPTS]


def pair(mode, temperature):
    from nwor_lab.disagg import EnginePair
    return EnginePair("tiny", 0, LabConfig(nwor_mode=mode, cuda_graph=False),
                      (("k", 3), ("num_blocks", 64), ("block_size", 16), ("temperature", temperature), ("seed", 5)))


def one_engine(p, prompts):
    from nwor_lab.engine.generate import acceptance_stats
    e = p.build("cuda")
    reqs = [e.add_request(x, NEW) for x in prompts]
    e.run()
    return [r.output for r in reqs], acceptance_stats(e.trace, e.k)[0]


@pytest.mark.parametrize("mode", ["off", "stage"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("strategy", ["nwor", "write_all"])
def test_cuda_ipc_decodes_one_engines_tokens(prompts, mode, temperature, strategy):
    from nwor_lab.disagg import run_handoff
    p = pair(mode, temperature)
    ref, ref_acc = one_engine(p, prompts)
    res = run_handoff(p, prompts, NEW, strategy, transport="cuda_ipc")
    assert res.transport == "cuda_ipc" and res.token_ids == ref
    assert res.mean_acceptance_length == ref_acc
    assert res.extra["control_bytes"] < sum(res.kv_bytes)          # the K/V did not go over the control channel


def test_rows_arrive_on_the_gpu():
    """In one process the IPC path cannot be opened (CUDA refuses a handle of its own process); what
    the sender exports with on_device is what travels: CUDA tensors."""
    from nwor_lab.disagg import prefill
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device="cuda")
    from nwor_lab.engine import SpecEngine
    e = SpecEngine(target, head, LabConfig(nwor_mode="stage", cuda_graph=False), k=3, num_blocks=64, block_size=16)
    s = prefill(e, [tok.encode(PROMPTS[0]).ids], NEW, "nwor", on_device=True)[0]
    assert all(t.is_cuda for n, t in s.tensors.items() if n.startswith(("key.", "value.")))


def test_cpu_refused():
    from nwor_lab.disagg import run_ipc_handoff
    with pytest.raises(ValueError, match="cuda_ipc"):
        run_ipc_handoff(pair("stage", 0.0), [[1, 2, 3]], 4, device="cpu")
