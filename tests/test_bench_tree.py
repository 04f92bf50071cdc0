"""`bench tree`: its rows from engine steps on the shipped pair (real EAGLE-2 trees, greedy) and on the 8B
path at toy size (forced paths), remap's window microbenchmark, every strategy checked against
target-only; the CLI's registration and errors."""
import pytest
import torch

from nwor_lab.bench.tree import bonus_check, path_acceptance, shape_rows, shipped_rows, stage_vs_move


def test_path_acceptance_walks_sibling_ranks_down_the_tree():
    from nwor_lab.speculative.tree_window import TreeWindow
    # t_last -> 1, 2; 1 -> 3, 4; 3 -> 5 | a second request: t_last -> 1, 2
    parents = [[0, 0, 1, 1, 3], [0, 0]]
    w = TreeWindow.build(parents, torch.arange(8).view(2, 4), [0, 0], 4)
    acc = path_acceptance(w, [[0, 1], [1]])
    assert acc.draft_mask.tolist() == [True, False, False, True, False, False, True]
    assert acc.accepted_per_request() == [2, 1]


def test_shipped_rows_every_strategy_equals_target_only():
    rows = shipped_rows(nodes=(8,), topk=3, depth=3, block_size=4, prompts=("def f(x):", "import os\n"), reps=1,
                        new_tokens=6)
    by = {r["strategy"]: r for r in rows}
    assert set(by) == {"write-all+move", "write-all+remap", "cow", "stage"}
    assert all(r["equals_target_only"] for r in rows), rows
    assert by["write-all+remap"]["exact_compaction"] and by["stage"]["batch"] == 2
    assert by["stage"]["step_ms_from"] == "engine decode steps" and by["stage"]["tree_windows"] > 0
    assert by["stage"]["rows_written_per_token"] == 1.0
    assert by["stage"]["bytes_moved"] == by["write-all+remap"]["bytes_moved"] == 0
    assert by["stage"]["stranded_bytes"] == by["cow"]["stranded_bytes"] == 0
    assert by["write-all+remap"]["block_size"] == 1 and by["stage"]["block_size"] == 4
    # write-all writes all 8 nodes + t_last per request; move adds the path's moved rows on top
    assert by["write-all+move"]["rows_written_per_token"] > by["write-all+remap"]["rows_written_per_token"] > 1.0
    assert by["cow"]["rows_written_per_token"] > by["write-all+move"]["rows_written_per_token"]
    assert all(0 < r["commit_share"] < 1 and r["tokens_per_s"] > 0 for r in rows)


def test_shape_rows_forced_path_on_the_8b_path_small():
    from nwor_lab.model.llama import LlamaForCausalLM
    from nwor_lab.model.shapes import config_for
    torch.manual_seed(0)
    target = LlamaForCausalLM(config_for("8b-mini", num_hidden_layers=2))    # the 8b path's shape, small
    rows = shape_rows("8b-mini", nodes=(8,), batches=(2,), topk=2, depth=4, block_size=4, context=10, accepted=3,
                      reps=1, device="cpu", attention="torch", target=target, new_tokens=9)
    assert len(rows) == 4 and all(r["equals_target_only"] for r in rows), rows
    # the peaked head's trees are deep enough for the forced path (a flat random head's stop short: 2.333)
    assert all(r["accepted_lens"] == [3.0, 3.0] and r["draft_logit_std"] == 6.0 for r in rows)
    assert all(r["bonus_checked"] > 0 and r["bonus_mismatches"] == 0 for r in rows if "bonus_checked" in r)
    move = next(r for r in rows if r["strategy"] == "write-all+move")
    assert move["bytes_moved"] > 0 and move["stranded_bytes"] > 0
    summary = stage_vs_move(rows)
    assert set(summary["stage_over_move_step"]) == {"N8_b2"}


def test_bonus_check_catches_a_token_the_target_would_not_pick():
    """The 8B path's check fails when an emitted bonus token is not target-only's pick."""
    from nwor_lab.bench.tree import build_engine, forced_path, run_decode_steps, tree_spec
    from nwor_lab.model.llama import LlamaForCausalLM
    from nwor_lab.model.shapes import config_for, random_head
    torch.manual_seed(0)
    target = LlamaForCausalLM(config_for("8b-mini", num_hidden_layers=2)).eval()
    head = random_head(target, "eagle1", "8b-mini")
    engine = build_engine(target, head, "stage", tree_spec(2, 3, 4), block_size=4, batch=1, prompt_len=6,
                          new_tokens=5, attention="torch", graphs=False, acceptance=forced_path(1, 3))
    with torch.no_grad():
        reqs, _ = run_decode_steps(engine, [[1, 2, 3, 4, 5, 6]], 5)
        check = bonus_check(target, 1e-4)
        assert check(reqs, engine)[0]
        reqs[0].output[-1] = (reqs[0].output[-1] + 1) % target.config.vocab_size
        ok, fields = check(reqs, engine)
    assert not ok and fields["bonus_mismatches"] == 1


def test_cli_bench_tree_is_registered_and_checks_its_flags(capsys):
    from nwor_lab.cli.main import BENCHMARKS, main
    assert "tree" in BENCHMARKS
    assert main(["bench", "tree", "--nodes", "99", "--topk", "2", "--depth", "2"]) == 2
    assert "--nodes 99" in capsys.readouterr().err
    assert main(["bench", "tree", "--model", "8b-mini", "--accepted", "5", "--depth", "3"]) == 2
    assert "--accepted 5" in capsys.readouterr().err


def test_remap_without_move_costs_another_engines_windows_and_times_no_step():
    rows = shipped_rows(nodes=(4,), topk=2, depth=3, block_size=4, prompts=("def f(x):",), reps=1, new_tokens=4,
                        strategies=("remap", "stage"))
    remap, stage = rows
    assert (remap["strategy"], stage["strategy"]) == ("write-all+remap", "stage")
    assert remap["accepted_lens"] == stage["accepted_lens"] and remap["exact_compaction"]
    assert remap["step_ms"] is None and "write-all+move" in remap["step_ms_from"]
    assert remap["equals_target_only"] == stage["equals_target_only"] is True


def test_graph_replays_split_at_idle_gaps_and_sum_by_kernel():
    """bench tree --graphs --profile: each replay's kernels are one group on the device timeline (a pause
    follows every replay); a graph's µs per kernel is the median over its replays, names cut as eager."""
    from nwor_lab.bench.graph_profile import per_replay_kernels, split_replays

    def replay(t0, gemm, attn):       # one step: two GEMMs and an attention kernel, back to back
        return [{"ts": t0, "dur": gemm, "name": "gemm"}, {"ts": t0 + gemm, "dur": attn, "name": "attn"},
                {"ts": t0 + gemm + attn, "dur": gemm, "name": "gemm"}]
    order = ["move", "stage", "stage", "move"]
    events = replay(0, 100, 30) + replay(5000, 101, 25) + replay(10000, 99, 26) + replay(15000, 102, 31)
    groups = split_replays(list(reversed(events)), len(order))
    assert [len(g) for g in groups] == [3, 3, 3, 3] and groups[1][0]["ts"] == 5000
    assert split_replays(events, 5) is None            # replays that cannot be told apart: nothing attributed
    out = per_replay_kernels(order, groups, top=1)
    assert out["move"] == [{"kernel": "gemm", "us_per_step": 202.0, "calls_per_step": 2.0},
                           {"kernel": "(all kernels)", "us_per_step": 232.5, "calls_per_step": 3.0}]
    assert out["stage"][0] == {"kernel": "gemm", "us_per_step": 200.0, "calls_per_step": 2.0}
    assert per_replay_kernels(["a"], [[{"ts": 0, "dur": 1, "name": "k" * 120}]])["a"][0]["kernel"] == "k" * 90


def test_step_ratio_pairs_repeats_and_falls_back_to_medians():
    """A repeat's ratio cancels drift between repeats: two strategies drifting together give a steady
    paired ratio where the ratio of the medians can land on either side of 1."""
    from nwor_lab.bench.ratios import step_ratio
    from nwor_lab.bench.tree import stage_vs_move
    move = {"graph_step_ms": 10.3, "graph_step_ms_reps": [10.0, 10.3, 10.6]}
    stage = {"graph_step_ms": 10.4, "graph_step_ms_reps": [9.9, 10.2, 10.4]}    # faster in every repeat
    assert step_ratio(stage, move) == pytest.approx(0.99) and stage["graph_step_ms"] > move["graph_step_ms"]
    assert step_ratio({"graph_step_ms": 2.0}, move) == pytest.approx(2.0 / 10.3)            # no repeats: medians
    assert step_ratio(dict(stage, graph_step_ms_reps=[9.9]), move) == pytest.approx(10.4 / 10.3)  # unequal counts
    rows = [dict(move, strategy="write-all+move", nodes=16, batch=8, step_ms=30.0),
            dict(stage, strategy="stage", nodes=16, batch=8, step_ms=31.0)]
    s = stage_vs_move(rows)
    assert s["stage_over_move_graph_step"] == {"N16_b8": 0.99} and s["stage_no_slower_everywhere_graphed"]
    assert s["stage_over_move_step"] == {"N16_b8": round(31.0 / 30.0, 4)} and not s["stage_no_slower_everywhere"]


def test_first_tree_window_emits_target_only_tokens():
    """Chapter 14 draws the head's first tree for a prompt from the engine: its path and emitted tokens are
    those of greedy target-only decoding."""
    from nwor_lab.bench.tree import first_tree_window
    from nwor_lab.engine import generate
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny()
    ids = tok.encode("def parse_args(argv):").ids
    w = first_tree_window(target, head, ids, topk=3, depth=3, nodes=8, block_size=4)
    assert len(w["parents"]) == len(w["tokens"]) == len(w["path"]) == 8 and sum(w["path"]) == w["accepted"]
    assert [t for t, on in zip(w["tokens"], w["path"]) if on] == w["emitted"][:-1]
    ref = generate([ids], w["accepted"] + 2, k=0, target=target, head=head, tokenizer=tok).token_ids[0]
    assert w["emitted"] == ref[1:w["accepted"] + 2]      # the prefill emitted ref[0]; the window the next a + 1
