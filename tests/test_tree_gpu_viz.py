"""viz.tree_gpu reads stored GPU tree runs: the verify-attention time from a profile, stage over move per
(N, batch), launch variants side by side, tree against chain through the engine."""
import plotly.graph_objects as go
import pytest

from nwor_lab.viz.tree_gpu import (attention_us, gap_widens_with_n, launch_attention, stage_vs_move,
                                   stage_vs_move_figure, strategy_table, tree_vs_chain_engine,
                                   tree_vs_chain_engine_figure)


def bench_row(strategy, nodes, batch, graph_ms, attn_us, commit_ms):
    costs = {"rows_written_per_token": 1.0 if strategy == "stage" else 4.75, "step_ms": 30.0,
             "bytes_moved": 0 if strategy == "stage" else 2048 * batch, "stranded_bytes": 0}
    kernels = [{"kernel": "nvjet_gemm", "us_per_step": 999.0, "calls_per_step": 64.0},
               {"kernel": "_verify_attention_kernel", "us_per_step": attn_us, "calls_per_step": 32.0}]
    row = {"strategy": strategy, "nodes": nodes, "batch": batch, "commit_ms": commit_ms, "kernels": kernels, **costs}
    if graph_ms is None:
        row["graph_error"] = "RuntimeError: host lists"
    else:
        row["graph_step_ms"] = graph_ms
    return row


BENCH = {"rows": [bench_row("write-all+move", 16, 8, 10.0, 2000.0, 0.4),
                  bench_row("stage", 16, 8, 11.0, 3000.0, 0.2),
                  bench_row("write-all+remap", 16, 8, None, 1900.0, 0.7),
                  bench_row("write-all+move", 16, 1, 8.0, 1000.0, 0.4),
                  {"strategy": "stage", "nodes": 16, "batch": 1, "error": "OOM"}]}


def test_stage_vs_move_reads_graphed_steps_and_the_attention_kernel():
    assert attention_us(BENCH["rows"][0]) == 2000.0 and attention_us({"strategy": "x"}) is None
    rows = stage_vs_move(BENCH)
    assert len(rows) == 1                       # batch 1's stage row failed: no pair there
    r = rows[0]
    assert (r["nodes"], r["batch"]) == (16, 8)
    assert abs(r["graph_ratio"] - 1.1) < 1e-9 and abs(r["graph_extra_ms"] - 1.0) < 1e-9
    assert abs(r["attention_ratio"] - 1.5) < 1e-9 and abs(r["attention_extra_ms"] - 1.0) < 1e-9
    assert (r["commit_ms_move"], r["commit_ms_stage"]) == (0.4, 0.2)
    assert isinstance(stage_vs_move_figure(rows), go.Figure)


def test_the_strategy_table_shows_graphed_steps_and_eager_where_no_graph():
    lines = strategy_table(BENCH).splitlines()
    assert lines[0].split()[:3] == ["N", "strategy", "rows/token"] and len(lines) == 1 + 3   # cow has no row
    move, remap, stage = lines[1].split(), lines[2].split(), lines[3].split()
    assert move[:5] == ["16", "write-all+move", "4.75", "2", "0"]       # 2 KiB moved per request, both batches
    assert move[5:] == ["8.00", "10.00"] and remap[5:] == ["–", "(eager", "30.0)"]
    assert stage[5:] == ["–", "11.00"]                                  # batch 1's stage row failed


def test_the_attention_is_every_attention_kernel():
    row = bench_row("stage", 16, 8, 10.0, 800.0, 0.2)
    row["kernels"] += [{"kernel": "_tree_window_kernel", "us_per_step": 200.0, "calls_per_step": 32.0},
                       {"kernel": "_rope_kernel", "us_per_step": 50.0, "calls_per_step": 32.0}]
    assert attention_us(row) == 1000.0


def test_stage_vs_move_takes_the_runs_paired_ratio():
    rows = [bench_row("write-all+move", 16, 8, 11.0, 2000.0, 0.4), bench_row("stage", 16, 8, 11.2, 2000.0, 0.2)]
    assert stage_vs_move({"rows": rows})[0]["graph_ratio"] == pytest.approx(11.2 / 11.0)     # the medians
    paired = {"rows": rows, "summary": {"stage_over_move_graph_step": {"N16_b8": 0.995}}}  # the bench's pairs
    assert stage_vs_move(paired)[0]["graph_ratio"] == 0.995


def test_kernel_change_pairs_points_and_strategies():
    from nwor_lab.viz.tree_gpu import kernel_change
    def run(us_move, us_stage):
        rows = [dict(bench_row("write-all+move", 16, 8, 10.0, 2000.0, 0.4)), dict(bench_row("stage", 16, 8, 10.0, 2000.0, 0.2))]
        for r, us in zip(rows, (us_move, us_stage)):
            r["kernels"] = [{"kernel": "_tree_window_kernel", "us_per_step": us}]
        return {"rows": rows}
    assert kernel_change(run(100.0, 200.0), run(80.0, 150.0), "_tree_window_kernel") == [0.8, 0.75]
    assert kernel_change(run(100.0, 200.0), run(80.0, 150.0), "_other") == []


def test_launch_attention_puts_variants_side_by_side():
    slower = {"rows": [bench_row("write-all+move", 16, 8, 10.0, 2000.0, 0.4),
                       bench_row("stage", 16, 8, 12.0, 4000.0, 0.2)]}
    table = launch_attention({"before": slower, "after": BENCH}, [(16, 8), (64, 32)])
    assert [(r["variant"], r["strategy"]) for r in table] == [("before", "write-all+move"), ("before", "stage"),
                                                              ("after", "write-all+move"), ("after", "stage")]
    assert table[1][(16, 8)] == 4000.0 and table[3][(16, 8)] == 3000.0 and table[3][(64, 32)] is None


def test_tree_vs_chain_engine_pairs_tree_and_chain_per_batch_size_and_policy():
    def row(kind, nwor, tok_s, acc, batch=8):
        return {"batch_size": batch, "kind": kind, "nodes": 16, "nwor": nwor,
                "tree": "topk=4,depth=5,nodes=16" if kind == "tree" else None, "tokens_per_s": tok_s,
                "mean_acceptance_length": acc, "decode_step_ms": 10.0}
    results = [row("tree", "stage", 300.0, 4.0), row("chain", "stage", 200.0, 4.5), row("tree", "off", 310.0, 4.0),
               {"batch_size": 8, "kind": "chain", "nodes": 16, "nwor": "off", "error": "OOM"},
               row("tree", "stage", 900.0, 4.0, batch=32), row("chain", "stage", 1000.0, 4.0, batch=32)]
    rows = tree_vs_chain_engine(results)
    assert [(r["batch"], r["nwor"]) for r in rows] == [(8, "stage"), (32, "stage")]   # off lacks its chain
    assert rows[0]["tree_over_chain"] == 1.5 and rows[0]["chain_acceptance"] == 4.5
    assert rows[1]["tree_over_chain"] == 0.9
    assert isinstance(tree_vs_chain_engine_figure(rows), go.Figure)
    assert gap_widens_with_n(rows)                          # one N per group: nothing to shrink
    wider = dict(rows[0], nodes=32, tree_over_chain=1.2)
    assert not gap_widens_with_n([rows[0], wider]) and gap_widens_with_n([dict(rows[0], tree_over_chain=1.1), wider])


def test_the_verdicts_are_built_from_the_rows():
    from nwor_lab.viz.tree_gpu_text import engine_answer_text, stored_run_text
    data = {"rows": [dict(r, exact_compaction=True) for r in BENCH["rows"] if "error" not in r]}
    again = {"rows": [bench_row("write-all+move", 16, 8, 10.0, 2000.0, 0.4), bench_row("stage", 16, 8, 9.9, 2000.0, 0.2)]}
    text = stored_run_text(data, "tree_8b_x.json", {"again.json": again})
    # the one pair (N 16, batch 8): graphed 11 / 10 ms, attention 3000 / 2000 µs; the repeat had stage ahead
    assert "Not at every point.** Replayed" in text and "graphed step no slower everywhere" in text and "1.100–1.100× write-all + move's" in text
    assert "N = 16 batch 8 (1.100×)" in text and "1.50–1.50× move's attention kernels" in text
    assert "the 2 stored runs of this step put `stage` at 0.990–1.100× move: on both sides of 1" in text
    assert "stores no eager comparison" in text           # no summary: the verdict is scoped to the graph
    eager = dict(data, summary={"stage_over_move_step": {"N16_b1": 0.99, "N16_b8": 1.04}})
    assert "slower at N = 16 batch 8: no claim of 'no slower' holds for eager steps" in stored_run_text(eager, "x.json")
    alone = stored_run_text(data, "x.json", {"same.json": data})
    assert "slower in every run, by at most 10.0% of the step" in alone
    tvc = [{"batch": 8, "nodes": 16, "nwor": "stage", "tree": "t", "tree_tok_s": 300.0, "chain_tok_s": 200.0,
            "tree_over_chain": 1.5, "tree_acceptance": 4.0, "chain_acceptance": 4.5, "tree_step_ms": 9.0,
            "chain_step_ms": 8.0}]
    runs = [{"profiles": [{"kind": "tree", "nodes": 16, "mean_acceptance_length": 4.4, "windows": 44, "prompts": 4},
                          {"kind": "chain", "nodes": 16, "mean_acceptance_length": 4.6, "windows": 53, "prompts": 4}],
             "prompts": "random ids"}]
    answer = engine_answer_text(tvc, runs)
    assert "won at every point: 1.50–1.50×" in answer and "batch 8: the tree at N = 16 under stage, 300 tok/s" in answer
    assert "at N = 16 (profile means" in answer and "At N = 16 batch 8 neither holds" in answer
    assert "one run of each cannot" in answer and "each configuration ran once" in answer
    # both policies, their runs taken in turn: the paired ratio and the repeats are the rows'
    tvc.append(dict(tvc[0], nwor="off", tree_tok_s=297.0, tree_over_chain=1.485))
    runs[0]["results"] = [{"kind": "tree", "nwor": "stage", "repeats": 5, "seconds_over_off": 0.988},
                          {"kind": "tree", "nwor": "off", "repeats": 5, "seconds_over_off": 1.0}]
    answer = engine_answer_text(tvc, runs)
    assert "`stage`'s run lasted 0.988–0.988× write-all + move's (the median of 5 paired runs" in answer
    assert "within 1.2% of each other" in answer and "each configuration ran 5 times" in answer
