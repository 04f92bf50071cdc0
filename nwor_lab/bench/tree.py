"""Tree windows, strategy by strategy, through the engine: one JSON row per strategy x shape
(`nwor-lab bench tree --json`).

    nwor-lab bench tree --json                          the shipped pair on CPU (default)
    nwor-lab bench tree --model 8b --json --out f.json  the Llama-3-8B shape on a GPU (N 16/32/64, batch 1/8/32)

Strategies (policies/tree.py): write-all + move (`off`: all N nodes written at n + 1 .. n + N, the path
copied to n + 1 .. n + a), write-all + remap (block size 1: the table re-pointed at the path's slots,
SGLang at page size 1), `cow` (log the N slots, restore, move), `stage` (nodes in the staging buffer,
the path committed to n + 1 .. n + a in one launch).

Every strategy the engine can commit (those whose write policy is an `nwor_mode`: move, cow, stage)
runs `SpecEngine` steps with `LabConfig.tree` = (topk, depth, nodes): prefill, the head drafting an
EAGLE-2 tree each step, tree verify, the strategy's commit. Write-all + remap is no `nwor_mode` (the
engine would have to apply the table its commit returns): its row takes the same windows' costs and
times its commit in one window-level microbenchmark (`bench.tree_window`), beside move's commit of the
same window; its `step_ms` is move's engine step with move's commit swapped for remap's
(`step_ms_from` says so).

shipped  the tiny trained pair (float32, CPU by default), `PROMPTS` (below) in one batch, greedy
         acceptance by the target. `equals_target_only`: every request's output equals target-only
         greedy decoding (`generate(k=0)`).
8b       random weights (`model.shapes`, bf16; `8b-mini` the same path at toy size), random prompts of
         `--context` tokens, a random EAGLE-1-shaped head drafting the trees (its logits standardised to
         std 6, `peaked_drafts`: a flat random head's trees are too shallow for the forced path),
         acceptance forced along the first-child (best-scored) path to `--accepted` nodes a step
         (random weights accept nothing; a path that meets a leaf first stops there). The accepted nodes are the head's, not the target's; the bonus token after them is
         the target's greedy pick over the cache the strategy committed, so `equals_target_only`:
         every bonus token equals a dense target-only pass over the same tokens (`bonus_checked`,
         `bonus_mismatches`: a corrupted commit shifts the target's next-token pick).
Per row: `rows_written_per_token` (cache rows written per layer per emitted token: write-all N + 1
plus moves, stage 1; over the run's tree windows), `bytes_moved` (inside the cache, all layers) and
`stranded_bytes` (rejected rows left in the block that holds the path's end, all layers), both a window's
mean (a window: one decode step of the batch; `tree_windows` of them); `accepted_len` (mean accepted
nodes a request a window), `accepted_lens` (per request, its mean);
`step_ms` (the engine's decode steps, median over the steps of a run, median of `--reps` runs taken
round-robin over the strategies; `step_ms_reps` the per-run medians), `commit_ms` (the write policy's
commit alone, timed in the untimed check run, the device synchronised around it) and `commit_share`,
`tokens_per_s` (emitted tokens / decode step time: drafting included, the same in every strategy).
`--graphs` (CUDA) adds `graph_step_ms` (`graph_step_ms_reps`): the same runs on engines whose steps are
replayed from CUDA graphs (or `graph_error`); the summary then also compares stage with write-all +
move on the replayed steps. `--profile` (CUDA) adds `kernels`: the decode steps' top CUDA kernels by
time (torch.profiler over one eager run, `kernels_from`).
The CUDA paths (`--device cuda`, `--graphs`, `--profile`) cannot run on a machine without a GPU; they
take the same code as the CPU path, with the device synchronised around each timed step.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time

import torch

from nwor_lab.bench.output import save_json
from nwor_lab.bench.ratios import step_ratio
from nwor_lab.bench.timing import device_name, in_turn
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import parse_tree
from nwor_lab.policies.tree import STRATEGIES, STRATEGY_TITLES, TREE_STRATEGIES, tree_commit_costs
from nwor_lab.window import Acceptance

PROMPTS = ("def parse_args(argv):", "import os\n", "class Config:\n    def __init__(self,", "for i in range(",
           "def main():", "    return self.", "with open(path) as f:", "if __name__ == ")


def tree_spec(topk: int, depth: int, nodes: int) -> str:
    """`LabConfig.tree`'s spelling of an EAGLE-2 tree (checked: a malformed one names the flags)."""
    return parse_tree("--topk/--depth/--nodes", f"topk={topk},depth={depth},nodes={nodes}").spelling


def engine_strategies(strategies) -> list[str]:
    """The strategies the engine commits: those whose write policy is an `nwor_mode` (not remap's)."""
    return [s for s in strategies if not TREE_STRATEGIES[s].block_size_one]


# -- what a run's tree windows cost ----------------------------------------------------------------
def path_acceptance(window, ranks: list[list[int]]) -> Acceptance:
    """The Acceptance of a committed tree window from the engine's trace: per request the sibling
    rank of each accepted node (`WindowTrace.path_ranks`), walked from t_last down the window's parents."""
    mask = []
    for parents, path in zip(window.parents_host(), ranks):
        at, taken = 0, set()
        for rank in path:
            at = [i + 1 for i, p in enumerate(parents) if p == at][rank]
            taken.add(at)
        mask += [i + 1 in taken for i in range(len(parents))]
    return Acceptance.from_draft_mask(window, torch.tensor(mask, dtype=torch.bool))


class WindowCosts:
    """An engine observer: every committed tree window's costs under each of `strategies`
    (`tree_commit_costs`: host arithmetic on the window and its accepted path) over the run.
    Remap's are those of block size 1; the others' of the engine's cache."""

    def __init__(self, strategies):
        self.strategies = list(strategies)
        self.rows = dict.fromkeys(self.strategies, 0.0)
        self.moved = dict.fromkeys(self.strategies, 0)
        self.stranded = dict.fromkeys(self.strategies, 0)
        self.accepted: dict[int, list[int]] = {}      # req_id -> accepted nodes per window
        self.last = None                               # (parents, draft mask) of the last tree window
        self.windows = 0                               # tree windows (a window: one decode step of the batch)

    def on_phase(self, event) -> None:
        """Per-phase events are no cost of the window's commit: nothing to count."""

    def on_window_end(self, engine, entry, window) -> None:
        if entry.kind != "verify" or entry.path_ranks is None or not sum(entry.drafted):
            return
        acc = path_acceptance(window, entry.path_ranks)
        spec = engine.cache.spec
        layers = engine.target.config.num_hidden_layers
        # t_last's position n only matters modulo the block size (the block that holds the path's end)
        starts = [sum(1 + n for n in window.num_draft_tokens[:r]) for r in range(len(window.num_draft_tokens))]
        slots = window.commit_slots.cpu().tolist()
        for s in self.strategies:
            bs = 1 if TREE_STRATEGIES[s].block_size_one else spec.block_size
            c = tree_commit_costs(s, window, acc, num_layers=layers, bytes_per_row=spec.bytes_per_token_layer,
                                  block_size=bs, context_lens=[slots[i] % bs for i in starts])
            tokens = sum(1 + a for a in c["accepted_len"])
            self.rows[s] += c["rows_written_per_token"] * tokens
            self.moved[s] += c["bytes_moved"]
            self.stranded[s] += c["rejected_bytes_in_blocks"]
        for rid, a in zip(entry.req_ids, acc.accepted_per_request()):
            self.accepted.setdefault(rid, []).append(a)
        self.last = (window.parents_host(), acc.draft_mask.cpu().tolist())
        self.windows += 1

    def costs(self, strategy: str) -> dict:
        """`strategy`'s row fields over the windows seen (module doc)."""
        lens = [sum(a) / len(a) for _, a in sorted(self.accepted.items())]
        paths = [a for per in self.accepted.values() for a in per]      # one a request a window
        tokens = sum(1 + a for a in paths)
        return {"accepted_len": round(sum(paths) / max(1, len(paths)), 3),
                "accepted_lens": [round(x, 3) for x in lens],
                "rows_written_per_token": round(self.rows[strategy] / max(1, tokens), 4),
                "bytes_moved": round(self.moved[strategy] / max(1, self.windows)),
                "stranded_bytes": round(self.stranded[strategy] / max(1, self.windows)),
                "tree_windows": self.windows}


# -- one engine per strategy --------------------------------------------------------------------------
def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_decode_steps(engine, prompts, new_tokens: int) -> tuple[list, list[float]]:
    """Queue `prompts`, step the engine to the end -> (the requests, ms of each decode step: a step
    whose verify window holds no prefill; the device synchronised around every step)."""
    reqs = [engine.add_request(list(p), new_tokens) for p in prompts]
    times = []
    while engine.scheduler.has_work:
        seen = len(engine.trace)
        _sync(engine.device)
        t0 = time.perf_counter()
        engine.step()
        _sync(engine.device)
        ms = 1e3 * (time.perf_counter() - t0)
        verify = [e for e in engine.trace[seen:] if e.kind == "verify"]
        if verify and "prefill" not in verify[0].kinds:
            times.append(ms)
    return reqs, times


def check_run(engine, prompts, new_tokens: int, costs: WindowCosts) -> tuple[list, list[float]]:
    """The untimed first run: `costs` observing the windows, the write policy's tree commits timed
    (the device synchronised around each). -> (requests, commit ms per tree window)."""
    pol, commits = engine.policy, []
    inner = pol.commit

    def commit(acceptance):
        tree = getattr(pol.window, "is_tree", False)     # read before the commit closes the window
        _sync(engine.device)
        t0 = time.perf_counter()
        inner(acceptance)
        _sync(engine.device)
        if tree:
            commits.append(1e3 * (time.perf_counter() - t0))

    pol.commit = commit
    engine.observers.append(costs)
    try:
        reqs, _ = run_decode_steps(engine, prompts, new_tokens)
    finally:
        engine.observers.remove(costs)
        del pol.commit                   # the class's commit again
    return reqs, commits


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def build_engine(target, head, strategy: str, tree: str, *, block_size: int, batch: int, prompt_len: int,
                 new_tokens: int, attention: str, graphs: bool, acceptance=None):
    """The engine committing `tree` windows under `strategy` (its write policy's `nwor_mode`)."""
    from nwor_lab.bench.tree_engine import build_engine_8b
    from nwor_lab.engine.tree_plan import tree_plan
    mode = TREE_STRATEGIES[strategy].policy.name
    nodes = tree_plan(parse_tree("tree", tree)).nodes
    return build_engine_8b(target, head, tree, nodes, mode, batch, prompt_len, new_tokens, acceptance, attention,
                           graphs, block_size=block_size)


def kernel_profile(engine, prompts, new_tokens: int, top: int = 8) -> list[dict]:
    """Where a run's decode steps spend GPU time: the prompts queued and prefilled (one step, not
    profiled), then every further step under torch.profiler; its CUDA kernels, the `top` by time ->
    [{kernel, us_per_step, calls_per_step}] (names cut to 90 characters) and their total."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    for p in prompts:
        engine.add_request(list(p), new_tokens)
    engine.step()                        # the prefill step (a tree step holds prefills or decodes, not both)
    steps = 0
    _sync(engine.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        while engine.scheduler.has_work:
            engine.step()
            steps += 1
        _sync(engine.device)
    steps = max(1, steps)
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and e.device_time_total > 0]
    kernels.sort(key=lambda e: -e.device_time_total)
    out = [{"kernel": e.key[:90], "us_per_step": round(e.device_time_total / steps, 1),
            "calls_per_step": round(e.count / steps, 2)} for e in kernels[:top]]
    out.append({"kernel": "(all kernels)", "us_per_step": round(sum(e.device_time_total for e in kernels) / steps, 1),
                "calls_per_step": round(sum(e.count for e in kernels) / steps, 2)})
    return out


def strategy_rows(target, head, prompts, new_tokens: int, tree: str, check, *, strategies=STRATEGIES,
                  block_size: int = 16, reps: int = 3, attention: str = "auto", graphs: bool = False,
                  profile: bool = False, acceptance=None, progress=None, extra: dict | None = None) -> list[dict]:
    """One row per strategy for one tree shape and one batch of `prompts` (module doc). `check(requests,
    engine)` -> (equals_target_only, its fields) judges the check run's outputs."""
    dev = next(target.parameters()).device
    cuda = dev.type == "cuda"
    on_engine = engine_strategies(strategies)
    plen = max(len(p) for p in prompts)
    kw = dict(block_size=block_size, batch=len(prompts), prompt_len=plen, new_tokens=new_tokens,
              attention=attention, acceptance=acceptance)
    # remap's windows are the engine's under the strategy whose writes it shares (write-all: move's)
    remap_from = "move" if "move" in on_engine else on_engine[0] if on_engine else None
    remap = [s for s in strategies if TREE_STRATEGIES[s].block_size_one]
    rows, engines, graphed, failed, graph_failed, costs, commits, checks = {}, {}, {}, {}, {}, {}, {}, {}
    for s in on_engine:
        costs[s] = WindowCosts([s] + (remap if s == remap_from else []))    # each row costs its own windows
        try:
            engines[s] = build_engine(target, head, s, tree, graphs=False, **kw)
            reqs, commits[s] = check_run(engines[s], prompts, new_tokens, costs[s])
            checks[s] = check(reqs, engines[s])
        except Exception as e:  # noqa: BLE001 -- one strategy's failure is its row, the others still run
            engines.pop(s, None)
            failed[s] = _error(e)
            continue
        if graphs and cuda:
            try:
                graphed[s] = build_engine(target, head, s, tree, graphs=True, **kw)
                for _ in range(2):       # a cold run, then the run that captures the buckets' graphs
                    run_decode_steps(graphed[s], prompts, new_tokens)
            except Exception as e:  # noqa: BLE001 -- the eager row stands; the graph's failure is said in it
                graphed.pop(s, None)
                graph_failed[s] = _error(e)
    eager_ms = {s: [] for s in engines}
    graph_ms = {s: [] for s in graphed}
    for rep in range(reps):               # round-robin, ABBA: drift hits every strategy alike
        for s in in_turn(engines, rep):
            try:
                eager_ms[s].append(statistics.median(run_decode_steps(engines[s], prompts, new_tokens)[1]))
                if s in graphed:
                    graph_ms[s].append(statistics.median(run_decode_steps(graphed[s], prompts, new_tokens)[1]))
            except Exception as e:  # noqa: BLE001 -- a timed run that fails is the strategy's row
                failed[s] = _error(e)
                engines.pop(s), graphed.pop(s, None)
    base = {"model": (extra or {}).get("model"), "nodes": parse_tree("tree", tree).nodes if tree else 0,
            "batch": len(prompts), "tree": tree, "device": device_name(dev),
            "dtype": str(next(target.parameters()).dtype).replace("torch.", ""), **(extra or {})}
    for s in on_engine:
        title = STRATEGY_TITLES[s]
        if s in failed:
            rows[s] = {"strategy": title, **base, "block_size": block_size, "error": failed[s],
                       "equals_target_only": None}
            continue
        ok, fields = checks[s]
        step = statistics.median(eager_ms[s])
        commit = statistics.median(commits[s]) if commits[s] else None
        c = costs[s].costs(s)
        row = {"strategy": title, **base, "block_size": block_size, **c,
               "step_ms": round(step, 3), "step_ms_reps": [round(x, 3) for x in eager_ms[s]],
               "step_ms_from": "engine decode steps", "commit_ms": None if commit is None else round(commit, 4),
               "commit_share": None if commit is None or not step else round(commit / step, 4),
               "tokens_per_s": round(len(prompts) * (1 + c["accepted_len"]) / (step / 1e3), 1) if step else None,
               "equals_target_only": ok, **fields}
        if s in graph_ms:
            row["graph_step_ms"] = round(statistics.median(graph_ms[s]), 3)
            row["graph_step_ms_reps"] = [round(x, 3) for x in graph_ms[s]]
            reason = graphed[s].graphed_off
            if reason or not graphed[s].runner.graphed_steps:
                row["graph_error"] = reason or "no step was replayed from a graph"
        elif graphs and cuda:
            row["graph_error"] = graph_failed.get(s, "not captured")
        if profile and cuda:
            eng = graphed.get(s, engines[s])
            row["kernels"] = kernel_profile(eng, prompts, new_tokens)
            row["kernels_from"] = "one run's decode steps, " + ("graph replays" if s in graphed else "eager")
        rows[s] = row
    for s in remap:
        rows[s] = remap_row(s, costs.get(remap_from), rows.get(remap_from), rows.get("move"), base, target, dev)
    out = [rows[s] for s in strategies if s in rows]
    for r in out:
        if progress:
            progress(r)
    return out


def remap_row(strategy: str, costs: WindowCosts | None, source: dict | None, move: dict | None, base: dict,
              target, device) -> dict:
    """Write-all + remap's row: the engine windows of `source` (write-all + move's row, which writes what
    remap writes, or another strategy's when move did not run) costed at block size 1, its commit timed
    on the last of them beside move's (`bench.tree_window`); its step is `move`'s engine step with the
    commits swapped (None without a move row)."""
    from nwor_lab.bench.tree_window import remap_window_times
    row = {"strategy": STRATEGY_TITLES[strategy], **base, "block_size": 1}
    if costs is None or costs.last is None:
        return {**row, "error": "no engine strategy ran a tree window to cost and time remap on",
                "equals_target_only": None}
    cfg = target.config
    parents, mask = costs.last
    t = remap_window_times(parents, mask, num_layers=cfg.num_hidden_layers, kv_heads=cfg.num_key_value_heads,
                           head_dim=cfg.head_dim, dtype=next(target.parameters()).dtype, device=device)
    commit = t["remap"]["commit_ms"]
    row.update(costs.costs(strategy), commit_ms=commit, window_ms=t["remap"]["window_ms"],
               move_window_ms=t["move"]["window_ms"], move_window_commit_ms=t["move"]["commit_ms"],
               exact_compaction=t["remap"]["exact_compaction"],
               equals_target_only=None if source is None or "error" in source else
               bool(source["equals_target_only"] and t["remap"]["exact_compaction"]))
    if move is None or "error" in move:
        row.update(step_ms=None, commit_share=None, tokens_per_s=None,
                   step_ms_from="none: write-all+move's engine step is needed (run it with --strategies move,remap)")
        return row
    # remap writes what move writes (write-all) and commits otherwise: move's step, its commit swapped
    step = move["step_ms"] - t["move"]["commit_ms"] + commit
    row.update(step_ms=round(step, 3), step_ms_from=f"{move['strategy']}'s engine step - its window commit + "
               f"{row['strategy']}'s window commit (bench.tree_window)",
               commit_share=round(commit / step, 4) if step > 0 else None, tokens_per_s=round(base["batch"] * (1 + row["accepted_len"]) / (step / 1e3), 1) if step > 0 else None)
    return row


# -- the shipped pair: real trees from the EAGLE head, greedy ----------------------------------------
@torch.no_grad()
def shipped_rows(nodes=(8, 16, 32), topk: int = 4, depth: int = 6, block_size: int = 16, prompts=PROMPTS,
                 reps: int = 3, device: str = "cpu", strategies=STRATEGIES, pair=None, new_tokens: int = 16,
                 progress=None) -> list[dict]:
    """`bench tree` on the shipped pair: one row per strategy x node count (module doc). `pair`:
    (target, head, tokenizer) already loaded."""
    from nwor_lab.engine import generate
    if pair is None:
        from nwor_lab.model.shipped import load_tiny
        pair = load_tiny(device=device)
    target, head, tok = pair
    target, head = target.eval(), head.eval()
    ids = [tok.encode(p).ids for p in prompts]
    dev = next(target.parameters()).device
    ref = generate(ids, new_tokens, k=0, target=target, head=head, tokenizer=tok, device=dev).token_ids

    def check(reqs, engine):
        return [r.output for r in reqs] == ref, {}

    rows = []
    for n in nodes:
        rows += strategy_rows(target, head, ids, new_tokens, tree_spec(topk, depth, n), check,
                              strategies=strategies, block_size=block_size, reps=reps, attention="torch",
                              progress=progress, extra={"model": "shipped", "topk": topk, "depth": depth})
    return rows


class _FirstTreeWindow:
    """An engine observer keeping the first committed tree window of request 0 (chapter 14's drawing)."""

    def __init__(self):
        self.got = None

    def on_phase(self, event) -> None:
        """Per-phase events: not needed to draw the window."""

    def on_window_end(self, engine, entry, window) -> None:
        if self.got is None and entry.kind == "verify" and entry.path_ranks is not None and sum(entry.drafted):
            n = window.num_draft_tokens[0]
            acc = path_acceptance(window, entry.path_ranks)
            self.got = {"parents": window.parents_host()[0], "tokens": window.draft_token_ids[:n].tolist(),
                        "path": acc.draft_mask[:n].tolist(), "accepted": acc.accepted_per_request()[0],
                        "emitted": list(entry.emitted[0])}


@torch.no_grad()
def first_tree_window(target, head, prompt: list[int], topk: int, depth: int, nodes: int, block_size: int = 16,
                      strategy: str = "stage") -> dict:
    """`prompt` (token ids) through the engine until its first tree window is committed -> {parents
    (node i+1 -> 0 .. i), tokens (one a node), path ([N] bool, the accepted nodes), accepted (a),
    emitted (the path's tokens + the target's bonus token)}."""
    spec = tree_spec(topk, depth, nodes)
    engine = build_engine(target, head, strategy, spec, block_size=block_size, batch=1, prompt_len=len(prompt),
                          new_tokens=depth + 2, attention="torch", graphs=False)
    seen = _FirstTreeWindow()
    engine.observers.append(seen)
    engine.add_request(list(prompt), depth + 2)
    while seen.got is None and engine.scheduler.has_work:
        engine.step()
    if seen.got is None:
        raise RuntimeError(f"first_tree_window: the engine finished {prompt!r} without a tree window")
    return seen.got


# -- the 8B shape: random weights, forced paths -------------------------------------------------------
def forced_path(accepted: int, depth: int, seed: int = 0):
    """Acceptance forced along the first child (EAGLE-2 numbers nodes best-scored first) to `accepted`
    nodes a window, or to a leaf before that."""
    from nwor_lab.speculative.tree_forced import TreeForcedAcceptance
    return TreeForcedAcceptance(tuple([1.0] * accepted + [0.0] * (depth - accepted)), seed, ((1.0,),))


@contextlib.contextmanager
def peaked_drafts(head, std: float):
    """While open, `head`'s logits standardised per row to `std` (the target's untouched: EAGLE-1 shares
    its LM head, only the head's method is swapped). Random weights draft near-flat distributions
    (logit std ~0.2 on 8b-mini), whose EAGLE-2 trees are one or two levels of siblings (the best-scored
    nodes are all shallow) and leave a forced path nowhere to go; at std 6 the top draft takes about
    half the mass, as a trained head's does, and the trees take EAGLE-2's deep shapes (a first-child
    chain of 3-6 nodes at N = 16..64 on 8b-mini). The step still runs the head's full LM head."""
    inner = head.compute_logits

    def compute_logits(hidden):
        z = inner(hidden).float()
        z = z - z.mean(-1, keepdim=True)
        return std * z / z.std(-1, keepdim=True).clamp_min(1e-6)

    head.compute_logits = compute_logits
    try:
        yield head
    finally:
        del head.compute_logits          # the class's method again


@torch.no_grad()
def bonus_check(target, tol: float):
    """-> check(requests, engine): each verify window's last emitted token (the target's own pick
    after the accepted nodes) against a dense target-only pass over the same tokens; a pick passes
    when its dense logit is within `tol` x the largest logit of the dense maximum (bf16 near-ties)."""
    def check(reqs, engine):
        by_id = {r.req_id: r for r in reqs}
        at = {r.req_id: 0 for r in reqs}
        picks = {r.req_id: [] for r in reqs}               # output indices of the target's own picks
        for w in engine.trace:
            if w.kind != "verify":
                continue
            for rid, a, out in zip(w.req_ids, w.accepted, w.emitted):
                if rid in at:
                    if len(out) == a + 1:                  # not cut by max_new_tokens
                        picks[rid].append(at[rid] + a)
                    at[rid] += len(out)
        checked, bad, gap = 0, 0, 0.0
        for rid, idx in picks.items():
            r = by_id[rid]
            seq = list(r.prompt) + list(r.output)
            dev = next(target.parameters()).device
            hidden = target.forward_dense(torch.tensor([seq], device=dev))[0]
            pos = torch.tensor([len(r.prompt) + i - 1 for i in idx], device=dev)
            logits = target.compute_logits(hidden[pos]).float()
            got = torch.tensor([r.output[i] for i in idx], device=dev)
            g = logits.max(-1).values - logits.gather(1, got[:, None])[:, 0]
            bound = tol * logits.abs().max(-1).values
            checked += len(idx)
            bad += int((g > bound).sum())
            gap = max(gap, float(g.max()) if len(idx) else 0.0)
        return bad == 0 and checked > 0, {"bonus_checked": checked, "bonus_mismatches": bad,
                                          "bonus_max_logit_gap": round(gap, 6), "bonus_tolerance": tol}
    return check


@torch.no_grad()
def shape_rows(model: str = "8b", nodes=(16, 32, 64), batches=(1, 8, 32), topk: int = 4, depth: int = 6,
               block_size: int = 16, context: int = 1024, accepted: int = 3, reps: int = 3,
               device: str = "cuda", attention: str = "auto", strategies=STRATEGIES, graphs: bool = False,
               seed: int = 0, profile: bool = False, progress=None, target=None, head=None,
               new_tokens: int | None = None, draft_logit_std: float = 6.0) -> list[dict]:
    """`bench tree` on a random-weight shape (`8b`, or `8b-mini` to run the same path small on CPU).
    target / head: models of that shape already built (the target's device and dtype are used); the
    head drafts with its logits standardised to `draft_logit_std` (`peaked_drafts`)."""
    from nwor_lab.model.shapes import random_head, random_target
    if accepted > depth:
        raise ValueError(f"accepted={accepted}: a tree of depth {depth} accepts at most {depth} nodes a window; "
                         f"lower --accepted or raise --depth")
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    target = (target if target is not None else random_target(model, device, dtype)).eval()
    head = (head if head is not None else random_head(target, "eagle1", model)).eval()
    tol = 3e-2 if next(target.parameters()).dtype != torch.float32 else 1e-4
    new_tokens = new_tokens or 1 + 6 * (accepted + 1)          # a prefill's token, then six decode steps
    rows = []
    extra = {"model": model, "topk": topk, "depth": depth, "context": context, "forced_accepted": accepted,
             "draft_logit_std": draft_logit_std}
    with peaked_drafts(head, draft_logit_std):
        for batch in batches:
            gen = torch.Generator().manual_seed(seed + batch)
            prompts = torch.randint(0, target.config.vocab_size, (batch, context), generator=gen).tolist()
            for n in nodes:
                rows += strategy_rows(target, head, prompts, new_tokens, tree_spec(topk, depth, n),
                                      bonus_check(target, tol), strategies=strategies, block_size=block_size,
                                      reps=reps, attention=attention, graphs=graphs, profile=profile,
                                      acceptance=forced_path(accepted, depth, seed), progress=progress, extra=extra)
                if torch.device(device).type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = LabArgumentParser(prog="nwor-lab bench tree", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", type=types.output_file, help="also write the JSON here")
    p.add_argument("--model", choices=("shipped", "8b", "8b-mini"), default="shipped",
                   help="shipped: the tiny trained pair, real trees (default, CPU); 8b: the Llama-3-8B shape "
                   "(CUDA), forced paths; 8b-mini: the 8b path at toy size")
    p.add_argument("--device", type=types.device, default=None, help="default: cpu for shipped, cuda for 8b")
    p.add_argument("--nodes", type=types.listed(types.integer(1, 512), "node counts"), default=None,
                   help="nodes per tree (default: 8,16,32 shipped; 16,32,64 8b)")
    p.add_argument("--batches", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(1, 8, 32),
                   help="requests per window (8b; shipped: one request per prompt)")
    p.add_argument("--topk", type=types.integer(1, 64), default=4, help="EAGLE-2: children per expanded node")
    p.add_argument("--depth", type=types.integer(1, 64), default=6, help="EAGLE-2: expansion levels")
    p.add_argument("--block-size", type=types.integer(1, 1024), default=16)
    p.add_argument("--context", type=types.integer(1, 1 << 20), default=1024, help="8b: prompt tokens a request")
    p.add_argument("--accepted", type=types.integer(0, 64), default=3, help="8b: forced accepted nodes a window")
    p.add_argument("--new-tokens", type=types.integer(2, 4096), default=None,
                   help="tokens a request (default: 16 shipped; 8b: a prefill's token + 6 decode steps)")
    p.add_argument("--strategies", type=types.listed(types.one_of(STRATEGIES), "strategies"), default=STRATEGIES)
    p.add_argument("--reps", type=types.integer(1, 1000), default=3, help="timed runs per strategy (median)")
    p.add_argument("--attention", default="auto", choices=["auto", "triton", "torch"])
    p.add_argument("--graphs", action="store_true", help="CUDA: also time the steps replayed from CUDA graphs")
    p.add_argument("--profile", action="store_true", help="CUDA: also list each run's top kernels by time")
    args = p.parse_args(argv)
    device = args.device or ("cpu" if args.model in ("shipped", "8b-mini") else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"bench tree --model {args.model}: needs a CUDA device (none is visible here); run it on a "
                         f"GPU machine, or use --model shipped / 8b-mini on CPU")
    for n in args.nodes or ():
        most = args.topk + (args.depth - 1) * args.topk ** 2
        if n > most:
            raise UsageError(f"--nodes {n}: a tree of --topk {args.topk} and --depth {args.depth} proposes at most "
                             f"{most} nodes; lower --nodes or raise --depth / --topk")
    if args.model != "shipped" and args.accepted > args.depth:
        raise UsageError(f"--accepted {args.accepted}: a tree of --depth {args.depth} accepts at most {args.depth} "
                         f"nodes a window; lower --accepted or raise --depth")
    t0 = time.time()
    done: list[dict] = []

    def result(rows: list[dict], complete: bool) -> dict:
        return {"bench": "tree", "model": args.model, "device": rows[0]["device"] if rows else device,
                "torch": torch.__version__, "command": "nwor-lab bench tree " + " ".join(argv or sys.argv[1:]),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(time.time() - t0, 1),
                "complete": complete, "summary": stage_vs_move(rows), "rows": rows}

    def progress(row: dict) -> None:       # each row as it is made; what is measured survives a timeout
        done.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.out:
            save_json(result(done, False), args.out)

    if args.model == "shipped":
        rows = shipped_rows(args.nodes or (8, 16, 32), args.topk, args.depth, args.block_size, reps=args.reps,
                            device=device, strategies=args.strategies, new_tokens=args.new_tokens or 16,
                            progress=progress)
    else:
        rows = shape_rows(args.model, args.nodes or (16, 32, 64), args.batches, args.topk, args.depth,
                          args.block_size, args.context, args.accepted, args.reps, device, args.attention,
                          args.strategies, args.graphs, profile=args.profile, progress=progress,
                          new_tokens=args.new_tokens)
    text = save_json(result(rows, True), args.out)
    if args.json:
        print(text)
    else:
        for r in rows:
            if "error" in r:
                print(f"{r['strategy']:>16} N={r['nodes']:>3} batch={r['batch']:>3} FAILED: {r['error']}")
                continue
            share = "-" if r["commit_share"] is None else f"{r['commit_share']:.1%}"
            step = "-" if r["step_ms"] is None else f"{r['step_ms']:.2f}"
            print(f"{r['strategy']:>16} N={r['nodes']:>3} batch={r['batch']:>3} bs={r['block_size']:>2} "
                  f"a={r['accepted_len']:.2f} rows/token={r['rows_written_per_token']:.2f} moved={r['bytes_moved']} "
                  f"stranded={r['stranded_bytes']} step={step} ms commit={share} ok={r['equals_target_only']}")
    return 0


def stage_vs_move(rows: list[dict]) -> dict:
    """Per (nodes, batch): stage's step time over write-all + move's, and whether stage is no slower;
    from the eager engine steps (`step_ms`) and, where both were captured, the replayed ones: the median
    of the per-repeat ratios where both rows have their repeats (`<key>_reps`, taken round-robin: the
    ratio of one repeat cancels what drifts between repeats), else the ratio of the medians."""
    out = {}
    for key, name, verdict in (("step_ms", "stage_over_move_step", "stage_no_slower_everywhere"),
                               ("graph_step_ms", "stage_over_move_graph_step", "stage_no_slower_everywhere_graphed")):
        by = {}
        for r in rows:
            if r.get(key) is not None:
                by.setdefault((r["nodes"], r["batch"]), {})[r["strategy"]] = r
        stage, move = STRATEGY_TITLES["stage"], STRATEGY_TITLES["move"]
        ratios = {f"N{n}_b{b}": round(step_ratio(t[stage], t[move], key), 4)
                  for (n, b), t in sorted(by.items()) if stage in t and move in t}
        if ratios or key == "step_ms":
            out[name] = ratios
            out[verdict] = all(v <= 1.0 for v in ratios.values()) if ratios else None
    return out


if __name__ == "__main__":
    sys.exit(main())
