"""`generate(prompts, ..., tp=2)`: the engine over `tp` ranks, started here; the Python API of
tensor parallelism (`nwor-lab generate --tp N` calls it).

Each rank loads the checkpoint (the shipped pair by default) sliced for itself, builds the ordinary
engine on its shards (`engine.generate.prepare`), makes it one rank of the group
(`make_tensor_parallel`) and runs it; rank 0's tokens, texts and trace come back, with one
`RankReport` per rank (its KV heads, cache layers, optional cache shard and audit). Every rank emits
the same tokens by construction (rank 0's sampler output is broadcast); the launcher checks it.

`generate_many(prompts, runs, tp=...)` runs several configurations in one start of the ranks (a
run is a LabConfig, or a dict overriding the common arguments: config, k, temperature, seed, head,
max_new_tokens): starting processes costs seconds, a run of the tiny pair a fraction of one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.config import LabConfig, check_int
from nwor_lab.distributed.checks import ShardAudit
from nwor_lab.distributed.engine import AgreedScv, CrossRankCheck, make_tensor_parallel
from nwor_lab.distributed.group import DEFAULT_TIMEOUT_S, TPGroup
from nwor_lab.distributed.launcher import TensorParallelError, run_ranks, stop_requested
from nwor_lab.distributed.shard import check_tp, kv_heads, load_head_tp, load_llama_tp, q_heads, shard_head, \
    shard_llama
from nwor_lab.engine.generate import GenerationRecord, acceptance_stats, check_window_limits, prepare

RUN_KEYS = ("config", "k", "temperature", "seed", "head", "max_new_tokens")


@dataclass
class RankReport:
    """What one rank held and did in one run."""

    rank: int
    q_heads: list[int]               # the full model's query heads this rank computed
    kv_heads: list[int]              # the full model's KV heads its cache shard holds
    cache_layers: int                # target layers + the head's layer
    head_layer: int | None           # the head's cache layer (None: no head)
    token_ids: list[list[int]]
    records: list                    # its policies' WindowRecord per window, in trace order
    disagreements: int = 0           # debug: windows where its own sample differed from rank 0's
    cross_rank_checks: int = 0       # debug: windows CrossRankCheck compared over the ranks
    agreed_windows: int = 0          # verify windows whose sampler output came from rank 0 (AgreedScv)
    all_reduces: int = 0             # all-reduces this rank did in the run
    all_reduce_mismatches: int = 0   # debug: all-reduce results not bit-identical on every rank
    audit: dict | None = None        # ShardAudit.summary()
    replays: int = 0                 # steps replayed from a captured CUDA graph (engine.runner)
    key: torch.Tensor | None = field(default=None, repr=False)     # its cache shard (collect_caches)
    value: torch.Tensor | None = field(default=None, repr=False)


@dataclass
class TPGenerationResult(GenerationRecord):
    """A `GenerationRecord` as rank 0 saw it (no engine object: it lives in the rank), plus `tp` and
    one `RankReport` per rank (one only, this rank's, under torchrun)."""

    tp: int
    config: LabConfig
    ranks: list[RankReport] = field(default_factory=list)
    complete: bool = True

    def summary(self) -> dict:
        return {**super().summary(), "complete": self.complete, "tp": self.tp}


class CheckpointPair:
    """Loads (target, head, tokenizer) shards from a checkpoint directory laid out like the shipped
    one (None: the shipped pair); picklable, so it can travel to the ranks."""

    def __init__(self, directory=None):
        self.directory = directory
        self._target = None
        self._heads: dict = {}

    def full_config(self):
        from pathlib import Path

        from nwor_lab.model.loader import read_config
        from nwor_lab.model.shipped import TINY_DIR
        return read_config(Path(self.directory or TINY_DIR) / "config.json")

    def __call__(self, group: TPGroup, head: str, device, dtype):
        from pathlib import Path

        from nwor_lab.model.loader import load_tokenizer
        from nwor_lab.model.shipped import HEADS, TINY_DIR
        if head not in HEADS:
            raise ValueError(f"head={head!r}: the shipped heads are {', '.join(HEADS)}")
        d = Path(self.directory or TINY_DIR)
        if self._target is None:
            self._target = (load_llama_tp(d, group, device=device, dtype=dtype), load_tokenizer(d / "tokenizer.json"))
        target, tok = self._target
        if head not in self._heads:
            cfg, weights = HEADS[head]
            self._heads[head] = load_head_tp(d / cfg, d / weights, target, group, device, dtype)
        return target, self._heads[head], tok


class ShardedPair:
    """Wraps a picklable `factory(head) -> (full target, full head[, tokenizer])` (e.g. a toy pair):
    every rank builds the full models and keeps its shards."""

    def __init__(self, factory):
        self.factory = factory
        self._cache: dict = {}

    def full_config(self):
        return None

    def __call__(self, group: TPGroup, head: str, device, dtype):
        if head not in self._cache:
            out = self.factory(head)
            target, full_head = out[0], out[1]
            tok = out[2] if len(out) > 2 else None
            t = shard_llama(target, group, device=device, dtype=dtype)
            h = None if full_head is None else shard_head(full_head, t, group, device=device, dtype=dtype)
            self._cache[head] = (t, h, tok)
        return self._cache[head]


class ToyPair:
    """`model=ToyPair(seed)`: the toy pair of `nwor_lab.model.toy` (random weights, tunable acceptance;
    4 q heads, `kv_heads` KV heads), head "eagle1" or "eagle3"; no tokenizer (prompts are token ids)."""

    def __init__(self, seed: int = 0, kv_heads: int = 2):
        self.seed, self.kv_heads = seed, kv_heads

    def __call__(self, head: str):
        from nwor_lab.model.toy import toy_config, toy_eagle3, toy_pair
        target, h = toy_pair(self.seed, cfg=toy_config(num_key_value_heads=self.kv_heads))
        if head == "eagle3":
            h = toy_eagle3(target, self.seed)
        elif head != "eagle1":
            raise ValueError(f"head={head!r}: the toy pair has eagle1 and eagle3 heads")
        return target, h


def _agreed_stop(group: TPGroup) -> bool:
    """Rank 0's reading of the stop flag, on every rank (one int per step), so all ranks leave the
    step loop at the same step and no collective is left waiting."""
    flag = torch.tensor([int(stop_requested())], dtype=torch.int64, device=group.device)
    return bool(group.broadcast_(flag, src=0).item())


def _rank_generate(group: TPGroup, source, prompts, runs: list[dict], common: dict) -> list[RankReport | dict]:
    """One rank: every run in turn on freshly built engines (same shards, a new cache each). With
    `interruptible`, every step ends with the ranks agreeing whether to stop (Ctrl-C in the parent);
    a stopped run returns what it generated (`complete` False) and the runs after it are skipped."""
    out = []
    interruptible = common.get("interruptible", False)
    common = {k: v for k, v in common.items() if k != "interruptible"}
    stopped = False
    for run in runs:
        if stopped:
            break
        kw = {**common, **run}
        head_name, collect, audit_on = kw.pop("head"), kw.pop("collect_caches"), kw.pop("audit")
        observers = list(kw.pop("observers"))
        target, head, tok = source(group, head_name, group.device, kw["dtype"])
        audit = ShardAudit() if audit_on else None
        reduces, mismatches = group.reductions, group.bit_mismatches
        gen = prepare(prompts, target=target, head=head, tokenizer=tok, device=group.device,
                      observers=observers + ([audit] if audit else []), **kw)
        engine = make_tensor_parallel(gen.engine, group)
        if interruptible:
            while gen.step():
                if _agreed_stop(group):
                    stopped = True
                    break
        else:
            gen.run()
        res = gen.result()
        cache = engine.cache
        full = target.full_config
        agreed = engine.scv if isinstance(engine.scv, AgreedScv) else None
        report = RankReport(
            rank=group.rank, q_heads=list(q_heads(full, group.rank, group.world_size)),
            kv_heads=list(kv_heads(full, group.rank, group.world_size)), cache_layers=cache.num_layers,
            head_layer=None if engine.head is None else engine.head.layer_index, token_ids=res.token_ids,
            records=[w.record for w in res.trace], disagreements=agreed.disagreements if agreed else 0,
            cross_rank_checks=sum(o.windows for o in engine.observers if isinstance(o, CrossRankCheck)),
            agreed_windows=agreed.windows if agreed else 0, all_reduces=group.reductions - reduces,
            all_reduce_mismatches=group.bit_mismatches - mismatches, audit=audit.summary() if audit else None,
            replays=engine.runner.replays,
            key=cache.key.detach().cpu().clone() if collect else None,
            value=cache.value.detach().cpu().clone() if collect else None)
        summary = None
        if group.rank == 0:
            summary = {"token_ids": res.token_ids, "texts": res.texts, "trace": res.trace,
                       "mean_acceptance_length": res.mean_acceptance_length,
                       "acceptance_by_position": res.acceptance_by_position,
                       "target_forwards": res.target_forwards, "config": engine.config, "complete": res.complete}
        out.append({"report": report, "summary": summary})
    return out


def generate_many(prompts, runs, tp: int = 2, *, max_new_tokens: int = 32, k: int = 4,
                  config: LabConfig | None = None, temperature: float = 0.0, seed: int = 0, head: str = "eagle1",
                  checkpoint=None, model=None, device="cpu", dtype=torch.float32, timeout_s: float = DEFAULT_TIMEOUT_S,
                  collect_caches: bool = False, audit: bool = False, observers=(), backend: str | None = None,
                  run_timeout_s: float | None = None, interruptible: bool = False,
                  **engine_kw) -> list[TPGenerationResult]:
    """One `TPGenerationResult` per entry of `runs` (a LabConfig, or a dict overriding any of
    config / k / temperature / seed / head / max_new_tokens), all in one start of `tp` ranks.

    checkpoint: a directory laid out like the shipped pair (default: the shipped pair); model: a
    picklable `factory(head_name) -> (full target, full head[, tokenizer])` instead (every rank
    builds it and keeps its shard). device "cpu" (gloo) or "cuda" (NCCL, rank r on cuda:r).
    collect_caches: each RankReport carries its cache shard; audit: each rank runs `ShardAudit`.
    timeout_s: the collective timeout. engine_kw: `prepare`'s other arguments (num_blocks,
    block_size, max_num_seqs, max_num_batched_tokens, stop_at_eos, cache_dtype, truncate_prompts,
    max_cache_memory). interruptible: Ctrl-C stops the ranks at the same step and returns what they
    generated (`complete` False; runs not started are left out). Raises TensorParallelError when a
    rank fails (naming it, with its error)."""
    tp = check_int("tp", tp, 1)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts: expected a non-empty list of prompts (each a str or a list of token ids)")
    if not isinstance(runs, (list, tuple)) or not runs:
        raise TypeError("runs: expected a non-empty list of LabConfig or dicts")
    norm = []
    for i, r in enumerate(runs):
        r = {"config": r} if isinstance(r, LabConfig) else dict(r)
        bad = sorted(set(r) - set(RUN_KEYS))
        if bad:
            raise ValueError(f"runs[{i}]: unknown keys {bad}; a run may set {', '.join(RUN_KEYS)}")
        norm.append(r)
    source = ShardedPair(model) if model is not None else CheckpointPair(checkpoint)
    full = source.full_config()
    if full is not None:                           # before any process starts
        check_tp(full, tp, "checkpoint")
        for r in norm:
            check_window_limits(r.get("k", k), r.get("max_new_tokens", max_new_tokens), full.max_position_embeddings)
    common = {"max_new_tokens": max_new_tokens, "k": k, "config": config, "temperature": temperature,
              "seed": seed, "head": head, "dtype": dtype, "collect_caches": collect_caches, "audit": audit,
              "observers": tuple(observers), "interruptible": interruptible, **engine_kw}
    per_rank = run_ranks(_rank_generate, tp, (source, list(prompts), norm, common), device=device,
                         backend=backend, timeout_s=timeout_s, run_timeout_s=run_timeout_s,
                         interruptible=interruptible)
    results = []
    for i in range(min(len(r) for r in per_rank if r is not None)):
        reports = [r[i]["report"] for r in per_rank if r is not None]
        s = next((r[i]["summary"] for r in per_rank if r is not None and r[i]["summary"] is not None), None)
        if any(rep.token_ids != reports[0].token_ids for rep in reports):
            raise TensorParallelError(f"runs[{i}]: the ranks emitted different tokens "
                                      f"({[rep.token_ids[0][:8] for rep in reports]}...): they did not agree "
                                      f"on the sampler's output")
        if s is None:    # under torchrun on a rank other than 0: this rank's own view
            rep = reports[0]
            mean, by_pos = acceptance_stats([], max(k, 1))
            s = {"token_ids": rep.token_ids, "texts": None, "trace": [], "mean_acceptance_length": mean,
                 "acceptance_by_position": by_pos, "target_forwards": 0, "config": norm[i].get("config", config)}
        results.append(TPGenerationResult(tp=tp, ranks=reports, **s))
    return results


def generate(prompts, max_new_tokens: int = 32, k: int = 4, config: LabConfig | None = None, *, tp: int = 2,
             **kw) -> TPGenerationResult:
    """`nwor_lab.engine.generate` over `tp` ranks: the same arguments (the model from `checkpoint`,
    default the shipped pair, or `model`; `head` "eagle1" / "eagle3"), plus tp, device, timeout_s
    and the options of `generate_many`."""
    return generate_many(prompts, [{}], tp, max_new_tokens=max_new_tokens, k=k, config=config, **kw)[0]
