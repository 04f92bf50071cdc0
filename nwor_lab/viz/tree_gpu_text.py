"""The verdicts chapter 14 renders from the stored GPU tree runs, as Markdown: what the 8B strategy
bench says about stage against write-all + move (and why, from its profile), and what the 8B engine
says about tree against chain. Every number comes from the rows given (`viz.tree_gpu`'s readers)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from nwor_lab.viz.tree_gpu import MOVE, STAGE, gap_widens_with_n, kernel_us, rows_by_point, stage_vs_move


def _span(xs, fmt: str = ".2f") -> str:
    return f"{min(xs):{fmt}}–{max(xs):{fmt}}"


def _kernel_ratios(data: Mapping, kernel: str) -> list[float]:
    """stage's µs per step in `kernel` over write-all + move's, at each point where both profiles list it."""
    pairs = [(kernel_us(p[STAGE], kernel), kernel_us(p[MOVE], kernel)) for p in rows_by_point(data).values()
             if STAGE in p and MOVE in p]
    return [a / b for a, b in pairs if a and b]


def _eager_scope(data: Mapping) -> str:
    """The same question for the eager step (host time included), from the run's summary: a verdict
    about the graphed step says nothing about the eager one, so the text gives both."""
    eager = (data.get("summary") or {}).get("stage_over_move_step") or {}
    if not eager:
        return "The run stores no eager comparison: the verdict above is the graphed step's only. "
    ratios = list(eager.values())
    over = [k.replace("_b", " batch ").replace("N", "N = ") for k, v in eager.items() if v > 1.0]
    return (f"Eager (host time included, one strategy after the other) it is {_span(ratios, '.3f')}× move's"
            + (f", slower at {', '.join(over)}: no claim of 'no slower' holds for eager steps. " if over
               else ", no slower at any point. "))


def stored_run_text(data: Mapping, name: str, repeats: Mapping[str, Mapping] | None = None) -> str:
    """`bench tree --model 8b --graphs --profile` JSON (`data`, stored as `name`) -> the section's verdict;
    `repeats` {name: JSON}: other runs of the same move/stage steps, whose spread says what a ratio near 1
    can and cannot order."""
    ok = [r for p in rows_by_point(data).values() for r in p.values()]
    sv = stage_vs_move(data)
    exact = "true" if all(r["exact_compaction"] for r in ok) else "NOT true"
    text = (
        f"**Reading the stored run** (`{name}`). Every strategy's commit is exact: the rows at n … n + a are bit for "
        f"bit those the verify pass computed — {exact} for every strategy, N and batch. What each writes is the table "
        f"above: `stage` **1** cache row per layer per emitted token, no bytes moved, none stranded; write-all + move "
        f"up to {max(r['rows_written_per_token'] for r in ok if r['strategy'] == MOVE):.2f} rows, and it leaves the "
        f"rest of the path's last block stranded behind every request.\n\n")
    if not sv:
        return text + "No point has both a `stage` and a write-all + move step: nothing to compare."
    g = [r["graph_ratio"] for r in sv]
    slower = [f"N = {r['nodes']} batch {r['batch']} ({r['graph_ratio']:.3f}×)" for r in sv if r["graph_ratio"] > 1.0]
    att = [r["attention_ratio"] for r in sv if r["attention_ratio"]]
    text += (
        f"**Is `stage`'s graphed step no slower everywhere? {'Yes' if max(g) <= 1.0 else 'Not at every point'}.** "
        f"Replayed from a CUDA graph, its step is {_span(g, '.3f')}× write-all + move's; slower than move at "
        f"{', '.join(slower) if slower else 'no point'}. " + _eager_scope(data)
        + f"From each row's `kernels` (torch.profiler): the commit is cheaper under `stage` "
        f"({_span([r['commit_ms_stage'] for r in sv])} ms against {_span([r['commit_ms_move'] for r in sv])} ms, "
        f"eager), and the tree verify attention now costs about the same under both")
    if att:
        text += f" ({_span(att)}× move's attention kernels per step)"
    tw = _kernel_ratios(data, "_tree_window_kernel")
    if tw:
        text += (f"; of it, the tree-window kernel reads `stage`'s nodes from the staging buffer in "
                 f"{_span(tw)}× the time write-all's takes from the cache")
    text += (". Both strategies run the same two kernels over the same tiles: the keys below the tree in the plain "
             "attention kernel, the tree's rows and the merge in `_tree_window_kernel`. ")
    if slower and repeats:
        ratios = {}
        for rep in repeats.values():
            for r in stage_vs_move(rep):
                ratios.setdefault((r["nodes"], r["batch"]), []).append(r["graph_ratio"])
        for r in sv:
            if r["graph_ratio"] > 1.0 and (r["nodes"], r["batch"]) in ratios:
                seen = ratios[r["nodes"], r["batch"]] + [r["graph_ratio"]]
                side = ("slower in every run, by at most " + f"{max(seen) - 1:.1%} of the step" if min(seen) > 1.0
                        else "on both sides of 1: the runs cannot order the two strategies there")
                text += (f"At N = {r['nodes']} batch {r['batch']} the {len(seen)} stored runs of this step put `stage` at "
                         f"{_span(seen, '.3f')}× move: {side}. ")
    return text


def engine_answer_text(tvc: Sequence[Mapping], runs: Sequence[Mapping]) -> str:
    """`tree_vs_chain_engine` rows (`tvc`) and the stored `bench.tree_engine 8b` runs they came from
    (their `profiles` and `prompts`) -> the answer to "is a tree worth it?" on the 8B engine."""
    wins = [r for r in tvc if r["tree_over_chain"] > 1]
    best: dict = {}
    for r in tvc:
        for kind in ("tree", "chain"):
            cand = (r[f"{kind}_tok_s"], kind, r["nodes"], r["nwor"])
            best[r["batch"]] = max(best.get(r["batch"], cand), cand)
    st = [r for r in tvc if r["nwor"] == "stage"] or list(tvc)
    off = [r for r in tvc if r["nwor"] == "off"] or list(tvc)
    more_accepted = [f"N = {r['nodes']} batch {r['batch']}" for r in st if r["chain_acceptance"] > r["tree_acceptance"]]
    prof = runs[0]["profiles"]
    pmean = {(p["kind"], p["nodes"]): p["mean_acceptance_length"] for p in prof}
    chain_ge = [f"N = {n}" for (k, n) in sorted(pmean) if k == "chain" and pmean[k, n] >= pmean.get(("tree", n), 1e9)]
    stage_off: dict = {}
    for r in tvc:
        stage_off.setdefault((r["batch"], r["nodes"]), {})[r["nwor"]] = r["tree_tok_s"]
    so = [v["stage"] / v["off"] for v in stage_off.values() if {"stage", "off"} <= set(v)]
    odd = [r for r in st if r["chain_acceptance"] > r["tree_acceptance"] and r["chain_step_ms"] < r["tree_step_ms"]]
    won = "won at every point" if len(wins) == len(tvc) else f"won at {len(wins)} of {len(tvc)} points"
    text = (
        f"**The GPU answer in these runs.** At the same verify size the tree {won}: "
        f"{_span([r['tree_over_chain'] for r in st])}× the chain's tokens/s under `stage`, "
        f"{_span([r['tree_over_chain'] for r in off])}× under write-all + move"
        f"{', the gap widening with N at every batch and policy' if gap_widens_with_n(tvc) else ''}. "
        "The fastest configuration at each batch: "
        + "; ".join(f"batch {b}: the {k} at N = {n} under {'write-all + move' if mode == 'off' else mode}, {v:.0f} tok/s"
                    for b, (v, k, n, mode) in sorted(best.items())) + ".")
    results = [r for run in runs for r in run.get("results", ()) if "error" not in r]
    reps = max((int(r.get("repeats", 1)) for r in results), default=1)
    runs_of_each = "once" if reps == 1 else f"{reps} times"
    n_runs = "one run" if reps == 1 else f"{reps} runs"
    if so:
        text += f" Tree-shaped `stage` against tree-shaped write-all + move in the engine: {_span(so)}× the tokens/s"
        paired = [r["seconds_over_off"] for r in results if r.get("kind") == "tree" and r.get("nwor") == "stage"
                  and "seconds_over_off" in r]
        if paired:
            text += (f"; with the two policies' runs taken in turn, `stage`'s run lasted {_span(paired, '.3f')}× "
                     f"write-all + move's (the median of {reps} paired runs at each point): in the engine the two "
                     f"run a tree step within {max(abs(x - 1) for x in paired):.1%} of each other, either way.")
        else:
            text += (" (one policy's runs after the other's: drift between them can order the policies either "
                     "way).")
    text += (
        "\n\n**Why, and the caveats.** Acceptance alone does not explain it: on the shipped pair the chain's profile "
        f"accepted as much or more at {', '.join(chain_ge) or 'no size'} (profile means "
        + ", ".join(f"N = {p['nodes']} {p['kind']} {p['mean_acceptance_length']:.2f}" for p in prof)
        + "), and in the engine the chain accepted more per step at "
        + (", ".join(more_accepted) if more_accepted else "no point")
        + ". It wins mostly by drafting: a chain of k = N runs the head N times in a row before each verify, the "
        "tree only depth times. "
        + "".join(f"At N = {r['nodes']} batch {r['batch']} neither holds: the chain's decode step was shorter "
                  f"({r['chain_step_ms']:.1f} against {r['tree_step_ms']:.1f} ms) and accepted more, yet its run was "
                  f"slower (the tree's tokens/s {r['tree_over_chain']:.2f}× the chain's under `stage`): a run lasts as "
                  f"long as its slowest request, which a mean per step does not show, and {n_runs} of each "
                  "cannot separate that from noise. " for r in odd)
        + " So this compares against a chain no one runs at large N: the usual chain is k = 4, which these runs did "
        "not measure on the 8B shape. The profiles come from the tiny shipped pair with few samples "
        f"({_span([p['windows'] for p in prof], 'd')} verify windows over {prof[0]['prompts']} prompts each), and "
        f"each configuration ran {runs_of_each} ({runs[0]['prompts']}). A real pair's acceptance decides the margin; the "
        "drafting cost of a long chain is the part that carries over.")
    return text
