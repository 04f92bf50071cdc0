"""`audit_conversations(...)`: the auditor on a multi-turn workload with a shared system prompt
(`audit.conversations`), with prefix caching and/or a small cache that preempts: every store of
`audit` plus `prefix_cache`, `head_cache` and `swap` (nwor_lab.audit.prefix) and, with a host tier
(`PrefixCacheConfig(host_blocks=N)`), `host_tier` (nwor_lab.audit.moved).

    report = audit_conversations(LabConfig(), pair, prefix_cache=PrefixCacheConfig(head_cache="missing"))
    report.reached                        # ["head_cache"]
    report.run["prefix"]["hit_rate"]      # the engine's prefix counters; report.run["preemption"] its preemptions

After the run, target-only runs the same closed loop (k = 0, prefix caching on: the tokens every
output is compared with, and the decoded blocks that calibrate the noise floor), then prefills every
registered prefix (target-only's blocks) and, for the head, every hit request's prompt with no
prefix caching (target-only + head's rows).
"""
from __future__ import annotations

import dataclasses

from nwor_lab.audit.conversations import Conversations, run_closed_loop
from nwor_lab.audit.kv import KVAudit
from nwor_lab.audit.moved import HostTierAudit
from nwor_lab.audit.prefix import PrefixAudit, ReferenceBlocks, SwapAudit, head_reference, noise_floor
from nwor_lab.audit.report import STORES, AuditReport, StoreFinding
from nwor_lab.audit.run import _present
from nwor_lab.audit.state import StateAudit
from nwor_lab.config import LabConfig, check_config
from nwor_lab.engine.trace import first_divergence

DEFAULT_TOLERANCE = 1e-5     # float32 K/V; the calibrated noise floor wins when larger


def default_num_blocks(conv: Conversations, max_new_tokens: int, k: int, block_size: int) -> int:
    """Room for every conversation's last turn at once, twice (so cached blocks are kept, not evicted)."""
    longest = max(len(conv.system) + sum(len(q) for q in c) + conv.turns * max_new_tokens for c in conv.questions)
    return 2 * conv.num_conversations * (-(-(longest + k + 1) // block_size)) + 1


def audit_conversations(config: LabConfig | None, pair, conv: Conversations, max_new_tokens: int = 8, *, k: int = 3,
                        prefix_cache=None, preemption=None, num_blocks: int | None = None, block_size: int = 16,
                        max_num_seqs: int = 8, tolerance: float | None = None, observers=()) -> AuditReport:
    """Run `conv` closed loop on `pair` (an audit Pair) under `config` with `prefix_cache` (a
    PrefixCacheConfig or None) and `preemption` (a Preemption or None: recompute), `num_blocks`
    (None: room for everything; small: preemptions), every store checked. `tolerance`: the least
    difference from target-only that names `prefix_cache` / `head_cache` (default 1e-5, raised to
    the calibrated noise floor). `observers`: engine observers run before the audit's own at each
    window's end (a chapter's or a test's fault injection). -> AuditReport (`run` adds prefix and preemption counters, the
    tolerance and its floor)."""
    from nwor_lab.engine import SpecEngine

    config = dataclasses.replace(check_config("config", config), cuda_graph=False)
    if pair.head is None:
        raise ValueError("pair.head: the auditor needs an EAGLE head that drafts")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: the auditor needs drafts, give k >= 1")
    if tolerance is not None and not tolerance >= 0:
        raise ValueError(f"tolerance={tolerance!r}: give a difference >= 0")
    if num_blocks is None:
        num_blocks = default_num_blocks(conv, max_new_tokens, k, block_size)
    common = dict(block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=1024)
    engine = SpecEngine(pair.target, pair.head, config, k=k, num_blocks=num_blocks, prefix_cache=prefix_cache,
                        preemption=preemption, **common)
    findings = {name: StoreFinding(name, present) for name, present in _present(engine).items()}
    engine.observers.extend(observers)
    engine.observers.append(KVAudit(engine, findings))
    watch = PrefixAudit(engine, findings)
    engine.observers.append(watch)
    SwapAudit(engine, findings)
    host = HostTierAudit(engine, findings) if engine.prefix is not None and engine.prefix.host is not None else None
    if engine.states is not None:
        engine.states = StateAudit(engine.states, engine, findings)
    turns = run_closed_loop(engine, conv, max_new_tokens)

    # target-only: the same closed loop (its tokens; its decoded blocks give the noise floor)
    # (its own prefix cache, never the audited engine's LabConfig.prefix_cache: see _target_only_cache)
    only = SpecEngine(pair.target, None, config.replace(prefix_cache=""), k=0,
                      num_blocks=default_num_blocks(conv, max_new_tokens, 0, block_size),
                      prefix_cache=_target_only_cache(engine), **common)
    ref_turns = run_closed_loop(only, conv, max_new_tokens)
    floor, tol = 0.0, DEFAULT_TOLERANCE if tolerance is None else float(tolerance)
    if engine.prefix is not None:
        prefixes = [s["tokens"] for s in watch.blocks.values() if s["tokens"]]
        prefixes += [r.tokens for _, _, r in ref_turns]
        blocks = ReferenceBlocks(pair.target, config, prefixes, block_size)
        floor = noise_floor(blocks, only)
        tol = max(tol, floor)
        head_rows = head_reference(pair.target, pair.head, config, k, watch.hits, block_size) if watch.hits else {}
        watch.finish(blocks, head_rows, tol)
        if host is not None:
            host.finish(blocks, tol)
    got, want = [r.output for _, _, r in turns], [r.output for _, _, r in ref_turns]
    d = first_divergence(got, want, trace=engine.trace, req_ids=[r.req_id for _, _, r in turns])
    divergence = None if d is None else {"request": d.prompt, "token": d.token, "expected": d.want, "got": d.got,
                                         "window": d.window}
    verify = [w for w in engine.trace if w.kind == "verify"]
    states = engine.states._inner if isinstance(engine.states, StateAudit) else engine.states
    run = {"model": pair.name, "strategy": engine.strategy, "nwor_mode": config.nwor_mode,
           "state_mode": states.name if states is not None else None, "k": k, "prompts": len(turns),
           "max_new_tokens": max_new_tokens, "sliding_window": config.sliding_window, "ring_slots": None,
           "windows": len(verify), "drafts": sum(sum(w.drafted) for w in verify),
           "accepted": sum(sum(w.accepted) for w in verify),
           "draft_chain_windows": sum(1 for w in engine.trace if w.kind == "draft"),
           "forced_acceptance": False, "device": str(engine.device),
           "state_unexplained": engine.states.unexplained if isinstance(engine.states, StateAudit) else None,
           "workload": conv.sizes(), "num_blocks": num_blocks, "block_size": block_size,
           "prefix": engine.prefix_stats(), "preemption": {"mode": engine.preemption.mode,
                                                           **engine.preemption_stats.as_dict()},
           "tolerance": tol, "noise_floor": floor}
    return AuditReport([findings[name] for name in STORES], divergence, run)


def _target_only_cache(engine):
    """Target-only's prefix cache: on whenever the audited engine's is (its head strategies mean nothing
    without a head)."""
    if engine.prefix is None:
        return None
    from nwor_lab.engine.prefix import PrefixCacheConfig
    return PrefixCacheConfig()
