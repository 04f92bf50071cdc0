"""`audit(...)`: one workload under a strategy, every store checked after every window, and the same
workload target-only for the first token that differs.

    report = audit(LabConfig(nwor_mode="off"), prompts, 24, target=target, head=head, k=3)
    report.store("kv").first_window        # 1: the first step whose rejected drafts left K/V behind
    report.first_divergence                # None: the tokens are target-only's
    print("\\n".join(report.json_lines()))

The checks are byte-level and never read what a policy declares (nwor_lab.audit.kv,
nwor_lab.audit.state); every step runs eagerly (observers keep CUDA graphs off).
"""
from __future__ import annotations

import dataclasses

from nwor_lab.audit.kv import KVAudit
from nwor_lab.audit.report import STORES, AuditReport, StoreFinding
from nwor_lab.audit.state import StateAudit
from nwor_lab.config import LabConfig, check_config


def audit(config: LabConfig | None, prompts, max_new_tokens: int, *, target, head, k: int = 3,
          model: str = "", tokenizer=None, block_size: int = 16, max_num_seqs: int = 8, num_blocks: int | None = None,
          acceptance=None, state_atol: float | None = None, reference: list[list[int]] | None = None) -> AuditReport:
    """Run `prompts` (token id lists, or text with `tokenizer`) for `max_new_tokens` each under
    `config` (nwor_mode, state_mode, sliding_window, kv_ring, ...) with `head` drafting `k` tokens
    greedily, auditing every store; then the same prompts target-only (k = 0), unless `reference`
    (their target-only outputs) is given.

    `acceptance`: a ForcedAcceptance (drafts accepted by a profile: the tokens are then not the
    target's, so `first_divergence` is expected). `state_atol`: the recurrent state's tolerance
    (default 0, bit for bit, on the torch backend; 1e-4 where fla's kernels run).
    -> AuditReport: one StoreFinding per store (absent ones marked), `first_divergence`, `run`."""
    from nwor_lab.engine.generate import generate, prepare

    config = check_config("config", config)
    if head is None:
        raise ValueError("head: the auditor needs an EAGLE head that drafts (rejected drafts are what it looks for)")
    config = dataclasses.replace(config, cuda_graph=False)
    gen = prepare(list(prompts), max_new_tokens, k, config, target=target, head=head, tokenizer=tokenizer,
                  block_size=block_size, max_num_seqs=max_num_seqs, num_blocks=num_blocks,
                  device=next(target.parameters()).device, acceptance=acceptance)
    engine = gen.engine
    findings = {name: StoreFinding(name, present) for name, present in _present(engine).items()}
    engine.observers.append(KVAudit(engine, findings))
    if engine.states is not None:
        engine.states = StateAudit(engine.states, engine, findings, atol=state_atol)
    gen.run()
    result = gen.result()
    if reference is None:
        reference = generate(list(prompts), max_new_tokens, 0, config, target=target, head=None, tokenizer=tokenizer,
                             block_size=block_size, max_num_seqs=max_num_seqs,
                             device=next(target.parameters()).device).token_ids
    verify = [w for w in result.trace if w.kind == "verify"]
    run = {"model": model or type(target).__name__, "strategy": engine.strategy, "nwor_mode": config.nwor_mode,
           "state_mode": engine.states._inner.name if engine.states is not None else None,
           "k": k, "prompts": len(result.token_ids), "max_new_tokens": max_new_tokens,
           "sliding_window": config.sliding_window, "ring_slots": engine.sliding.ring_slots if engine.sliding else None,
           "windows": len(verify), "drafts": sum(sum(w.drafted) for w in verify),
           "accepted": sum(sum(w.accepted) for w in verify),
           "draft_chain_windows": sum(1 for w in result.trace if w.kind == "draft"),
           "forced_acceptance": acceptance is not None, "device": str(engine.device)}
    return AuditReport([findings[name] for name in STORES], first_divergence(result.token_ids, reference, result.trace, [r.req_id for r in gen.requests]), run)


def _present(engine) -> dict[str, bool]:
    """Which stores this engine has (the model's and the configuration's facts, not a policy's)."""
    kv = engine.target.num_layers > 0
    return {"kv": kv, "kv_digests": kv,
            "ring": engine.sliding is not None and engine.sliding.ring_slots is not None,
            "recurrent_state": engine.states is not None, "conv_state": engine.states is not None,
            "draft_kv": engine.drafting}


def first_divergence(outputs: list[list[int]], reference: list[list[int]], trace=(), req_ids=None) -> dict | None:
    """The first token (by request, then position) where `outputs` differ from `reference`
    (target-only), with the step whose verify window emitted it (from `trace`, requests `req_ids`
    in the prompts' order); None when all agree."""
    for i, (got, want) in enumerate(zip(outputs, reference)):
        n = min(len(got), len(want))
        j = next((t for t in range(n) if got[t] != want[t]), n if len(got) != len(want) else None)
        if j is None:
            continue
        window = _emitted_in(trace, req_ids[i], j) if req_ids is not None else None
        return {"request": i, "token": j, "expected": want[j] if j < len(want) else None,
                "got": got[j] if j < len(got) else None, "window": window}
    return None


def _emitted_in(trace, req_id: int, token: int) -> int | None:
    """The step whose verify window emitted output token `token` of request `req_id`."""
    seen = 0
    for w in trace:
        if w.kind != "verify" or req_id not in w.req_ids:
            continue
        seen += len(w.emitted[w.req_ids.index(req_id)])
        if seen > token:
            return w.step
    return None
