"""Tensor parallelism on two GPUs over NCCL (NVLink SHARP multicast off: NCCL_NVLS_ENABLE=0), the
CUDA extension as backend: the CPU suite's checks (tests/test_tp.py) where they matter on the device.

- tp = 2 greedy tokens == tp = 1 (one GPU) in every NWOR x SCV mode, EAGLE-1, and with EAGLE-3;
- each rank's cache shard == the matching KV heads of the tp = 1 cache (float tolerance);
- rejected slots bit-identical on every rank under cow / stage (ShardAudit, per window);
- the draft head's layer present, written and committed on every rank;
- a rank that raises ends the run with a TensorParallelError naming it, within the timeout;
- `nwor-lab bench tp` runs tp 1 vs 2 (the 8B-shaped run: tests/gpu/device_run_tp.sh).
Skipped without 2 CUDA devices, and under compute-sanitizer (NWOR_LAB_SANITIZE=1).
Run: `bash tests/gpu/device_run_tp.sh` on the two-GPU machine.
"""
import itertools
import os
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")   # before any rank starts: the ranks inherit it

import pytest  # noqa: E402
import torch  # noqa: E402

from nwor_lab import LabConfig  # noqa: E402
from nwor_lab import distributed as D  # noqa: E402
from nwor_lab.engine import generate  # noqa: E402
from nwor_lab.model import load_tiny  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL tensor parallelism)"),
    pytest.mark.skipif(os.environ.get("NWOR_LAB_SANITIZE") == "1", reason="not under compute-sanitizer"),
]

PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return"]
NEW = 32
MODES = list(itertools.product(["off", "cow", "stage"], ["off", "graph", "adaptive"]))
RUNS = [{"config": LabConfig(nwor_mode=m, scv_mode=s, backend="cuda", debug=True)} for m, s in MODES] + [
    {"config": LabConfig(nwor_mode=m, scv_mode="graph", backend="cuda", debug=True), "head": "eagle3"}
    for m in ("cow", "stage")]


@pytest.fixture(scope="module")
def tp2(ext):
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    t0 = time.monotonic()
    out = D.generate_many(PROMPTS, RUNS, tp=2, max_new_tokens=NEW, device="cuda", collect_caches=True, audit=True,
                          timeout_s=120)
    print(f"tp=2 over NCCL: {len(out)} runs in {time.monotonic() - t0:.1f} s")
    return out


@pytest.fixture(scope="module")
def tp1(ext):
    pairs = {h: load_tiny(device="cuda", head=h) for h in ("eagle1", "eagle3")}
    out = []
    for run in RUNS:
        target, head, tok = pairs[run.get("head", "eagle1")]
        out.append(generate(PROMPTS, NEW, k=4, config=run["config"], target=target, head=head, tokenizer=tok))
    return out


def label(run):
    return f"{run.get('head', 'eagle1')} nwor={run['config'].nwor_mode} scv={run['config'].scv_mode}"


def test_gpu_tp2_tokens_equal_tp1_in_every_mode(tp2, tp1):
    for run, res, ref in zip(RUNS, tp2, tp1):
        assert res.token_ids == ref.token_ids, label(run)
        assert res.mean_acceptance_length > 1.5
        assert [len(r.token_ids) for r in res.ranks] == [len(PROMPTS)] * 2
        print(label(run), "own sample != rank 0's:", [r.disagreements for r in res.ranks],
              "all-reduces not bit-equal over ranks:", [f"{r.all_reduce_mismatches}/{r.all_reduces}" for r in res.ranks])


def test_gpu_tp2_cache_shards_equal_tp1_heads(tp2, tp1):
    for run, res, ref in zip(RUNS, tp2, tp1):
        key, value = ref.engine.cache.key.cpu(), ref.engine.cache.value.cpu()
        for rep in res.ranks:
            torch.testing.assert_close(rep.key, key[..., rep.kv_heads, :], atol=2e-3, rtol=2e-3, msg=label(run))
            torch.testing.assert_close(rep.value, value[..., rep.kv_heads, :], atol=2e-3, rtol=2e-3, msg=label(run))


def test_gpu_tp2_rejected_slots_and_head_layer_on_every_rank(tp2, tp1):
    for run, res, ref in zip(RUNS, tp2, tp1):
        n = ref.engine.target.num_layers
        for rep in res.ranks:
            assert rep.cache_layers == n + 1 and rep.head_layer == n
            assert rep.audit["rows_committed"].get(n, 0) > 0, label(run)
            assert rep.cross_rank_checks == len(res.trace)
            preserving = run["config"].nwor_mode in ("cow", "stage")
            assert (rep.audit["rejected_slot_layers_checked"] > 0) == preserving, label(run)


def test_gpu_tp2_failed_rank_stops_the_run(ext):
    t0 = time.monotonic()
    with pytest.raises(D.TensorParallelError, match="rank 1 raised RuntimeError: injected failure") as info:
        D.generate(PROMPTS[:1], NEW, tp=2, device="cuda", config=LabConfig(backend="cuda"), timeout_s=30,
                   observers=[D.FaultInjector(rank=1, after_window=1, how="raise")])
    assert info.value.rank == 1 and time.monotonic() - t0 < 90


def test_gpu_bench_step_tp1_vs_tp2(ext):
    from nwor_lab.bench.step import main
    out = main(["--tp", "1,2", "--model", "tiny", "--device", "cuda", "--steps", "3", "--warmup", "1",
                "--batch-sizes", "1", "--k", "4", "--nwor", "stage"])
    assert out["backend"] == "nccl" and [r["tp"] for r in out["results"]] == [1, 2]
    assert out["results"][1]["speedup_vs_tp1"] is not None


def test_gpu_tp2_graphed_steps_equal_tp1(ext):
    """Without debug or audit every step can be captured: tp = 2 replays its steps from CUDA graphs
    (the agreed SCV's and drafter's broadcasts captured with them) and decodes the tp = 1 tokens."""
    runs = [{"config": LabConfig(nwor_mode=m, scv_mode="graph", backend="cuda")} for m in ("off", "stage")]
    out = D.generate_many(PROMPTS, runs, tp=2, max_new_tokens=NEW, device="cuda", timeout_s=120)
    target, head, tok = load_tiny(device="cuda")
    for run, res in zip(runs, out):
        ref = generate(PROMPTS, NEW, k=4, config=run["config"], target=target, head=head, tokenizer=tok)
        assert res.token_ids == ref.token_ids, run["config"].nwor_mode
        assert all(rep.replays > 0 for rep in res.ranks)
