"""The hand-off across two GPUs over NCCL (nwor_lab.disagg.ranks, transport "nccl"): the prefill engine on
cuda:0, the decode engine on cuda:1, the rows sent GPU to GPU. Written without a GPU: unverified until
this runs on a two-card machine (skipped otherwise). The shipped pair, prompts with partial blocks:

- every strategy that declares itself exact decodes one engine's tokens (the reference runs on cuda:1
  between the hand-offs, in the same processes), greedy and seeded T > 0, under write-all (`off`) and
  `stage`; strategies that keep acceptance keep one engine's;
- the rows arrive on the decode GPU (cuda:1), not through host memory;
- bytes per strategy: write_all ships more than nwor (the partial blocks' junk rows), no_head less."""
import pytest
import torch

from nwor_lab.config import LabConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL: an engine per card)")]

PROMPTS = ["Once upon a time, there was a little girl named Lily. She", "The cat sat on the mat and"]
NEW = 16


@pytest.fixture(scope="module")
def prompts():
    from nwor_lab.model.shipped import load_tiny
    _, _, tok = load_tiny()
    ids = [tok.encode(t).ids for t in PROMPTS]
    assert any(len(p) % 16 for p in ids)             # a partial block: write_all's junk has rows to ship
    return ids


@pytest.mark.parametrize("mode", ["off", "stage"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nccl_decodes_one_engines_tokens_for_every_exact_strategy(prompts, mode, temperature):
    from nwor_lab.disagg import HANDOFF_STRATEGIES, ONE_ENGINE, EnginePair, run_rounds
    exact = [n for n, s in HANDOFF_STRATEGIES.items() if (s.exact_sampled if temperature else s.exact_greedy)]
    pair = EnginePair("tiny", 0, LabConfig(nwor_mode=mode, cuda_graph=False),
                      (("k", 3), ("num_blocks", 64), ("block_size", 16), ("temperature", temperature), ("seed", 5)))
    got = run_rounds(pair, prompts, NEW, [ONE_ENGINE, *exact], transport="nccl", timeout_s=300.0)
    ref = got[0]
    for name, res in zip(exact, got[1:]):
        assert res.transport == "nccl" and res.extra["rows_device"] == "cuda:1", name
        assert res.token_ids == ref["token_ids"], name
        if HANDOFF_STRATEGIES[name].keeps_acceptance:
            assert res.mean_acceptance_length == ref["mean_acceptance_length"], name
    kv = {n: sum(r.kv_bytes) for n, r in zip(exact, got[1:])}
    print(f"nccl {mode} T={temperature}: K/V bytes per strategy {kv}")
    assert kv["write_all"] > kv["nwor"] > 0
    if "no_head" in kv:
        assert 0 < kv["no_head"] < kv["nwor"]
