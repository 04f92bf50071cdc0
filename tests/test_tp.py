"""Tensor parallelism on the CPU (gloo): the engine and every write policy over 2 (and 4) ranks.

- tp = 2 greedy tokens == tp = 1 on the test prompts in every NWOR mode and every SCV mode (three
  pairs), EAGLE-1, and with the EAGLE-3 head in every NWOR mode; debug on (every rank: committed ==
  accepted; across ranks: the same committed slots, compared after every window);
- each rank's cache shard == the matching KV heads of the tp = 1 cache after the same run;
- rejected slots bit-identical (cow restores, stage never writes) on every rank, window by window;
- the draft head's layer (cache layer N) present, written and committed on every rank (the seed
  system built staging buffers for the target's layers only);
- KV heads replicated when there are fewer than ranks (tp = 4 over 2 KV heads);
- a rank that raises, dies (os._exit) or hangs ends the run with a TensorParallelError naming it,
  well within the collective timeout; `nwor-lab generate --tp 2` and torchrun.
One start of the ranks runs every mode in sequence (starting processes costs seconds).
"""
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from nwor_lab import distributed as D
from nwor_lab.config import NWOR_MODES, SCV_MODES, LabConfig
from nwor_lab.distributed.group import TPGroup
from nwor_lab.engine import generate
from nwor_lab.model import load_tiny
from nwor_lab.model.toy import toy_config, toy_pair

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "def parse_header(line):\n    \"\"\"Split a header line into its name and value.\"\"\"\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]
NEW = 20
# every write policy and every SCV mode once (the policy and the mask are independent pieces; the
# full 3 x 3 product on one process is tests/test_engine.py's)
MODES = list(zip(NWOR_MODES, SCV_MODES))
GREEDY_RUNS = [{"config": LabConfig(nwor_mode=m, scv_mode=s, debug=True)} for m, s in MODES] + [
    {"config": LabConfig(nwor_mode=m, scv_mode="graph", debug=True), "head": "eagle3"} for m in NWOR_MODES]
SAMPLED_RUN = {"config": LabConfig(nwor_mode="stage", scv_mode="adaptive", debug=True), "temperature": 0.8,
               "seed": 3}
TIMEOUT_S = 20          # collective timeout of the failure tests: they must end well within it + start-up


@pytest.fixture(scope="module")
def tiny():
    return {h: load_tiny(head=h) for h in ("eagle1", "eagle3")}


@pytest.fixture(scope="module")
def tp2():
    """Every greedy run and one sampled run, in one start of 2 gloo ranks."""
    t0 = time.monotonic()
    out = D.generate_many(PROMPTS, GREEDY_RUNS + [SAMPLED_RUN], tp=2, max_new_tokens=NEW, collect_caches=True,
                          audit=True, timeout_s=60)
    print(f"tp=2: {len(out)} runs in {time.monotonic() - t0:.1f} s (ranks started once)")
    return out


def run_tp1(tiny, run):
    target, head, tok = tiny[run.get("head", "eagle1")]
    return generate(PROMPTS, NEW, k=4, config=run["config"], target=target, head=head, tokenizer=tok,
                    temperature=run.get("temperature", 0.0), seed=run.get("seed", 0))


@contextmanager
def one_thread():
    """The references run here with one torch thread (two BLAS threads on a 2-core CI box can be 10x
    slower than one); the ranks use one each."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tp1(tiny):
    with one_thread():
        return [run_tp1(tiny, r) for r in GREEDY_RUNS]


def label(run):
    c = run["config"]
    return f"{run.get('head', 'eagle1')} nwor={c.nwor_mode} scv={c.scv_mode}"


# -- tp = 2 against tp = 1 -------------------------------------------------------------------------
@pytest.mark.slow
def test_greedy_tokens_equal_tp1_in_every_mode(tp2, tp1):
    assert {m for m, _ in MODES} == set(NWOR_MODES) and {s for _, s in MODES} == set(SCV_MODES)
    for run, res, ref in zip(GREEDY_RUNS, tp2, tp1):
        assert res.tp == 2 and len(res.ranks) == 2
        assert res.token_ids == ref.token_ids, label(run)
        assert res.texts == ref.texts and all(len(t) == NEW for t in res.token_ids)
        assert all(rep.token_ids == ref.token_ids for rep in res.ranks)
        assert res.mean_acceptance_length >= 2.0, (label(run), res.summary())


@pytest.mark.slow      # the tp = 2 runs (spawned ranks) it reads
def test_each_rank_cache_shard_equals_its_heads_of_tp1(tp2, tp1):
    for run, res, ref in zip(GREEDY_RUNS, tp2, tp1):
        cache = ref.engine.cache
        for rep in res.ranks:
            h = rep.kv_heads
            assert rep.key.shape == cache.key[..., h, :].shape, label(run)
            torch.testing.assert_close(rep.key, cache.key[..., h, :], atol=1e-4, rtol=1e-4, msg=label(run))
            torch.testing.assert_close(rep.value, cache.value[..., h, :], atol=1e-4, rtol=1e-4, msg=label(run))


def test_ranks_hold_their_heads():
    cfg = load_tiny()[0].config         # 4 q heads, 2 KV heads
    assert [list(D.q_heads(cfg, r, 2)) for r in range(2)] == [[0, 1], [2, 3]]
    assert [list(D.kv_heads(cfg, r, 2)) for r in range(2)] == [[0], [1]]
    assert [list(D.kv_heads(cfg, r, 4)) for r in range(4)] == [[0], [0], [1], [1]]   # replicated


@pytest.mark.slow      # the tp = 2 runs (spawned ranks) it reads
def test_rejected_slots_preserved_on_every_rank(tp2):
    """ShardAudit raised in the rank if a rejected slot changed under cow / stage, or a slot
    outside a window changed under any policy; here: it ran, and it had rejected slots to check."""
    for run, res in zip(GREEDY_RUNS, tp2):
        for rep in res.ranks:
            assert rep.audit["windows"] == len(res.trace), label(run)
            preserving = run["config"].nwor_mode in ("cow", "stage")
            assert (rep.audit["rejected_slot_layers_checked"] > 0) == preserving, label(run)


@pytest.mark.slow      # the tp = 2 runs (spawned ranks) it reads
def test_draft_head_layer_present_and_committed_on_every_rank(tp2, tp1):
    """The seed's bug: staging buffers for the target's layers only. Every rank's cache has the
    head's layer N, every rank wrote and committed it, and it holds the tp = 1 head layer's K/V."""
    for run, res, ref in zip(GREEDY_RUNS, tp2, tp1):
        n = ref.engine.target.num_layers
        for rep in res.ranks:
            assert rep.cache_layers == n + 1 and rep.head_layer == n, label(run)
            assert rep.audit["rows_written"].get(n, 0) > 0, label(run)
            assert rep.audit["rows_committed"].get(n, 0) == rep.audit["rows_committed"][0] > 0, label(run)
            assert rep.key[n].abs().sum() > 0 and rep.value[n].abs().sum() > 0
            torch.testing.assert_close(rep.key[n], ref.engine.cache.key[n][..., rep.kv_heads, :], atol=1e-4,
                                       rtol=1e-4)


@pytest.mark.slow      # the tp = 2 runs (spawned ranks) it reads
def test_debug_checks_ran_across_ranks(tp2):
    for run, res in zip(GREEDY_RUNS, tp2):
        verify = sum(w.kind == "verify" for w in res.trace)
        for rep in res.ranks:
            assert rep.cross_rank_checks == len(res.trace), label(run)   # every window, verify and draft
            assert rep.agreed_windows == verify                         # rank 0's sampler output, every window
            assert rep.disagreements == 0
            # every all-reduce left the same bits on both ranks: the same hidden states everywhere
            assert rep.all_reduces > 0 and rep.all_reduce_mismatches == 0
        assert [w.record.drafts_committed for w in res.trace] == [w.record.num_accepted for w in res.trace]
        assert all(r.records == res.ranks[0].records for r in res.ranks)


@pytest.mark.slow      # the tp = 2 runs (spawned ranks) it reads
def test_sampled_run_ranks_agree(tp2, tiny):
    res = tp2[-1]
    assert all(rep.token_ids == res.token_ids for rep in res.ranks)
    # on gloo every rank's own sample already equals rank 0's (bit-equal all-reduce); broadcast kept
    assert all(rep.disagreements == 0 and rep.cross_rank_checks == len(res.trace) for rep in res.ranks)
    greedy = tp2[MODES.index(("stage", "adaptive"))].token_ids
    assert res.token_ids != greedy                                  # it really sampled


# -- KV heads replicated: one KV head over 2 ranks (toy pair, multi-query attention) ---------------
@pytest.mark.slow
def test_kv_head_replicated_when_fewer_than_ranks():
    prompts = [[1, 5, 9, 2], [3, 3, 7, 11, 4, 8], [12]]
    cfg = LabConfig(nwor_mode="stage", scv_mode="graph", debug=True)
    (res,) = D.generate_many(prompts, [cfg], tp=2, max_new_tokens=12, model=D.ToyPair(0, kv_heads=1),
                             collect_caches=True, audit=True, block_size=4, timeout_s=60)
    target, head = D.ToyPair(0, kv_heads=1)("eagle1")
    with one_thread():
        ref = generate(prompts, 12, k=4, config=cfg, target=target, head=head, block_size=4)
    assert res.token_ids == ref.token_ids
    assert [rep.kv_heads for rep in res.ranks] == [[0], [0]] and [rep.q_heads for rep in res.ranks] == [[0, 1], [2, 3]]
    for rep in res.ranks:
        torch.testing.assert_close(rep.key, ref.engine.cache.key, atol=1e-5, rtol=1e-5)   # the whole (one-head) cache
        assert rep.audit["rows_committed"][target.num_layers] > 0


# -- sharding, in one process ---------------------------------------------------------------------
class PartialGroup(TPGroup):
    """A rank whose all-reduce does nothing: its row-parallel outputs are its partial sums."""

    def all_reduce_(self, t):
        return t


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_partials_sum_to_the_full_layer(tp):
    cfg = toy_config()
    target, head = toy_pair(0)
    x = torch.randn(2, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = target.model.rotary.cos_sin(torch.arange(5), x.dtype)
    full_layer = target.model.layers[1]
    attn, mlp = torch.zeros_like(x), torch.zeros_like(x)
    for r in range(tp):
        shard = D.shard_llama(target, PartialGroup(r, tp))
        layer = shard.model.layers[1]
        assert layer.self_attn.num_heads == cfg.num_attention_heads // tp
        assert layer.self_attn.num_kv_heads == max(1, cfg.num_key_value_heads // tp)
        assert isinstance(layer.self_attn.o_proj, D.RowParallelLinear) and isinstance(layer.mlp.down_proj,
                                                                                     D.RowParallelLinear)
        attn += layer.self_attn.forward_dense(x, cos, sin)
        mlp += layer.mlp(x)
        hs = D.shard_head(head, shard, PartialGroup(r, tp))
        assert hs.target is shard and hs.config.num_key_value_heads == layer.self_attn.num_kv_heads
    torch.testing.assert_close(attn, full_layer.self_attn.forward_dense(x, cos, sin), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mlp, full_layer.mlp(x), atol=1e-5, rtol=1e-5)


def test_row_parallel_bias_added_once():
    lin = torch.nn.Linear(4, 3, bias=True)
    w = lin.weight.detach()
    parts = []
    for r in range(2):
        rp = D.RowParallelLinear(2, 3, True, PartialGroup(r, 2))
        with torch.no_grad():
            rp.weight.copy_(w[:, 2 * r:2 * r + 2])
            rp.bias.copy_(lin.bias)
        parts.append(rp)
    x = torch.randn(5, 4)
    # a real all-reduce sums the bias-free partials; the bias comes once, after
    summed = sum(torch.nn.functional.linear(x[:, 2 * r:2 * r + 2], parts[r].weight) for r in range(2)) + lin.bias
    torch.testing.assert_close(summed, lin(x))
    assert set(dict(parts[0].named_parameters())) == {"weight", "bias"}


def test_check_tp_refuses_uneven_splits():
    cfg = toy_config()                                  # 4 heads, 2 KV heads, intermediate 64
    D.check_tp(cfg, 4)                                  # KV heads replicated: fine
    with pytest.raises(ValueError, match="4 attention heads do not split evenly over 3"):
        D.check_tp(cfg, 3)
    with pytest.raises(ValueError, match="attention heads"):
        D.check_tp(cfg, 8)
    big = toy_config(hidden_size=96, num_attention_heads=12, num_key_value_heads=4)
    with pytest.raises(ValueError, match="4 KV heads do not split evenly over 3"):
        D.check_tp(big, 3)
    with pytest.raises(ValueError, match="multiple of the KV head count"):
        D.check_tp(big, 6)
    with pytest.raises(ValueError, match="attention heads do not split"):
        D.generate(["x"], 4, tp=3)                       # checked before any rank starts


class LyingGroup(TPGroup):
    """Two ranks in one process; "rank 1" reports one more committed token than rank 0."""

    def __init__(self):
        super().__init__(0, 2)

    def all_gather(self, t):
        other = t.clone()
        if other.numel():
            other[-1] += 1
        return [t, other]

    def all_gather_ragged(self, t):
        return self.all_gather(t)


def test_cross_rank_check_catches_ranks_that_disagree():
    target, head = toy_pair(0)
    cfg = LabConfig(nwor_mode="stage", debug=True)
    with pytest.raises(AssertionError, match="rank 1 committed"):
        generate([[1, 2, 3]], 8, k=4, config=cfg, target=target, head=head, observers=[D.CrossRankCheck(LyingGroup())])


# -- a failed rank ends the run ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("how,expect", [("raise", "rank 1 raised RuntimeError: injected failure"),
                                        ("exit", "rank 1 the process exited with code 3"),
                                        ("hang", "rank 1 stopped answering")])
def test_failed_rank_stops_the_run(how, expect):
    t0 = time.monotonic()
    timeout = 3 if how == "hang" else TIMEOUT_S
    with pytest.raises(D.TensorParallelError) as info:
        D.generate(PROMPTS[:1], NEW, tp=2, observers=[D.FaultInjector(rank=1, after_window=1, how=how)],
                   timeout_s=timeout)
    took, ended = time.monotonic() - t0, time.time()
    err = info.value
    assert expect in str(err) and err.rank == 1, str(err)
    assert "the other ranks were stopped" in str(err).splitlines()[0]
    if how != "hang":     # rank 0 was blocked in a collective: it failed at once, as a consequence
        assert any(f["rank"] == 0 and f["kind"] == "collective" for f in err.failures)
        first = min(f["time"] for f in err.failures)
        assert ended - first < 5, f"{how}: the run ended {ended - first:.1f} s after the first failure"
    # the ranks start in about 5 s alone, and took 25 s once on a loaded 2-core machine: the bound is for a
    # run that stops at all (a hang would sit there forever); how soon is the check above, from the failure
    assert took < timeout + 45, f"{how}: took {took:.1f} s (the ranks start in about 5 s)"


# -- front ends -----------------------------------------------------------------------------------
def test_cli_generate_tp_refuses_before_starting_ranks(capsys):
    """The checks that need no rank (heads % tp, --stream); the CLI's run itself: the torchrun test."""
    from nwor_lab.cli.main import main
    assert main(["generate", "x", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nwor-lab: error: --tp=3: the checkpoint's 4 attention heads") and len(err.splitlines()) == 1
    assert main(["generate", "x", "--tp", "2", "--stream"]) == 2
    assert "--stream: not with --tp > 1" in capsys.readouterr().err
    assert main(["generate", "x", "--tp", "2", "--tp-timeout", "0"]) == 2
    assert "--tp-timeout" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_generate_tp2_under_torchrun(tmp_path):
    """`torchrun --nproc-per-node 2 -m nwor_lab.cli generate ... --tp 2`: each process is a rank
    (TPGroup.from_env), rank 0 prints the JSON, the tokens are tp = 1's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = ["x = 1\n", "--k", "4", "--nwor", "cow", "--scv", "graph", "--max-new-tokens", "8", "--json"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "nwor_lab.cli", "generate", *args, "--tp", "2"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out.stdout                     # rank 0 prints, rank 1 does not
    with one_thread():
        ref = generate(["x = 1\n"], 8, k=4, config=LabConfig(nwor_mode="cow", scv_mode="graph"))
    res = json.loads(lines[0])
    assert res["token_ids"] == ref.token_ids and res["tp"] == 2
    assert res["kv_heads_per_rank"] == [[0]]        # under torchrun a rank knows its own report only


@pytest.mark.slow
def test_bench_step_smoke():
    from nwor_lab.bench.tp import main
    out = main(["--tp", "2", "--model", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "0",
                "--batch-sizes", "2", "--k", "4", "--nwor", "stage", "--prompt-len", "8"])
    (row,) = out["results"]
    assert row["tp"] == 2 and row["step_ms_median"] > 0 and row["tokens_per_s"] > 0 and out["backend"] == "gloo"
