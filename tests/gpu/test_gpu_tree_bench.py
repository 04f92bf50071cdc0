"""`bench tree` on the GPU, small: the 8B code path at toy size (8b-mini, bf16, Triton tree attention, the CUDA
commit / log / restore ops) runs engine steps under every strategy the engine commits, their bonus tokens
equal to a dense target-only pass, and remap's window microbenchmark compacts exactly; the shipped pair's
real trees on CUDA equal target-only. (The graphed step is timed by tests/gpu/tree_run.sh in
a process of its own: a capture that fails must not leave this process's stream capturing.)

Run: PYTHONPATH=$PWD python -m pytest -q -m gpu tests/gpu/test_gpu_tree_bench.py
"""
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_shape_rows_on_cuda_equal_target_only(ext):
    from nwor_lab.bench.tree import shape_rows
    rows = shape_rows("8b-mini", nodes=(16,), batches=(2,), topk=4, depth=5, block_size=16, context=40, accepted=3,
                      reps=2, device="cuda", attention="auto")
    assert {r["strategy"] for r in rows} == {"write-all+move", "write-all+remap", "cow", "stage"}
    assert all(r["equals_target_only"] for r in rows), rows
    assert all(r["bonus_checked"] > 0 and r["bonus_mismatches"] == 0 for r in rows if "bonus_checked" in r), rows
    remap = next(r for r in rows if r["strategy"] == "write-all+remap")
    assert remap["exact_compaction"] and remap["block_size"] == 1, remap
    stage = next(r for r in rows if r["strategy"] == "stage")
    assert stage["rows_written_per_token"] == 1.0 and stage["dtype"] == "bfloat16" and stage["device"] != "cpu"


def test_shipped_rows_on_cuda_equal_target_only(ext):
    from nwor_lab.bench.tree import shipped_rows
    rows = shipped_rows(nodes=(8,), topk=3, depth=3, block_size=16, prompts=("def f(x):", "import os\n"), reps=1,
                        device="cuda")
    assert all(r["equals_target_only"] for r in rows), rows

