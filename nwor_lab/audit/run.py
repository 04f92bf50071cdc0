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
from nwor_lab.audit.prefix import SwapAudit
from nwor_lab.audit.report import STORES, AuditReport, StoreFinding
from nwor_lab.audit.state import StateAudit
from nwor_lab.config import LabConfig, check_config
from nwor_lab.engine.trace import first_divergence


def audit(config: LabConfig | None, prompts, max_new_tokens: int, *, target, head, k: int = 3,
          model: str = "", tokenizer=None, block_size: int = 16, max_num_seqs: int = 8, num_blocks: int | None = None,
          acceptance=None, state_atol: float | None = None, reference: list[list[int]] | None = None) -> AuditReport:
    """Run `prompts` (token id lists, or text with `tokenizer`) for `max_new_tokens` each under
    `config` (nwor_mode, state_mode, sliding_window, kv_ring, ...) with `head` drafting `k` tokens
    greedily, auditing every store; then the same prompts target-only (k = 0), unless `reference`
    (their target-only outputs) is given.

    `acceptance`: a ForcedAcceptance (drafts accepted by a profile: the tokens are then not the
    target's, so `first_divergence` is expected). `state_atol`: the recurrent state's tolerance
    (default 0, bit for bit, on the CPU; 1e-4 on CUDA).
    -> AuditReport: one StoreFinding per store (absent ones marked), `first_divergence`, `run`.
    Every argument is checked (and the engine built) before anything runs: `prepare_audit`."""
    return prepare_audit(config, prompts, max_new_tokens, target=target, head=head, k=k, model=model,
                         tokenizer=tokenizer, block_size=block_size, max_num_seqs=max_num_seqs, num_blocks=num_blocks,
                         acceptance=acceptance, state_atol=state_atol).run(reference)


class Audit:
    """An audit set up (the engine built, the prompts queued, the checks attached), not yet run."""

    def __init__(self, gen, config: LabConfig, prompts: list, max_new_tokens: int, k: int, model: str,
                 findings: dict[str, StoreFinding], options: dict):
        self.gen, self.config, self.prompts, self.max_new_tokens = gen, config, prompts, max_new_tokens
        self.k, self.model, self.findings, self.options = k, model, findings, options

    @property
    def engine(self):
        return self.gen.engine

    def run(self, reference: list[list[int]] | None = None) -> AuditReport:
        """Run the workload, then (unless `reference` is given) the same prompts target-only."""
        from nwor_lab.engine.generate import generate
        gen, engine, config = self.gen, self.gen.engine, self.config
        gen.run()
        result = gen.result()
        if reference is None:
            reference = generate(self.prompts, self.max_new_tokens, 0, config, target=engine.target, head=None,
                                 device=engine.device, **self.options).token_ids
        verify = [w for w in result.trace if w.kind == "verify"]
        states = engine.states._inner if isinstance(engine.states, StateAudit) else engine.states
        run = {"model": self.model or type(engine.target).__name__, "strategy": engine.strategy,
               "nwor_mode": config.nwor_mode, "state_mode": states.name if states is not None else None,
               "k": self.k, "prompts": len(result.token_ids), "max_new_tokens": self.max_new_tokens,
               "sliding_window": config.sliding_window,
               "ring_slots": engine.sliding.ring_slots if engine.sliding else None,
               "windows": len(verify), "drafts": sum(sum(w.drafted) for w in verify),
               "accepted": sum(sum(w.accepted) for w in verify),
               "draft_chain_windows": sum(1 for w in result.trace if w.kind == "draft"),
               "forced_acceptance": engine.acceptance is not None, "device": str(engine.device),
               "state_unexplained": engine.states.unexplained if isinstance(engine.states, StateAudit) else None}
        d = first_divergence(result.token_ids, reference, trace=result.trace, req_ids=[r.req_id for r in gen.requests])
        divergence = None if d is None else {"request": d.prompt, "token": d.token, "expected": d.want, "got": d.got,
                                             "window": d.window}
        return AuditReport([self.findings[name] for name in STORES], divergence, run)


def prepare_audit(config: LabConfig | None, prompts, max_new_tokens: int, *, target, head, k: int = 3,
                  model: str = "", tokenizer=None, block_size: int = 16, max_num_seqs: int = 8,
                  num_blocks: int | None = None, acceptance=None, state_atol: float | None = None) -> Audit:
    """`audit`'s set-up, arguments as `audit`: every limit checked, the engine built with the checks
    attached (a ValueError / TypeError here is bad input, before any work)."""
    from nwor_lab.engine.generate import prepare

    config = check_config("config", config)
    if head is None:
        raise ValueError("head: the auditor needs an EAGLE head that drafts (rejected drafts are what it looks for)")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: the auditor needs drafts, give k >= 1")
    config = dataclasses.replace(config, cuda_graph=False)
    prompts = list(prompts) if isinstance(prompts, (list, tuple)) else prompts
    options = dict(tokenizer=tokenizer, block_size=block_size, max_num_seqs=max_num_seqs)
    gen = prepare(prompts, max_new_tokens, k, config, target=target, head=head, num_blocks=num_blocks,
                  device=next(target.parameters()).device, acceptance=acceptance, **options)
    engine = gen.engine
    findings = {name: StoreFinding(name, present) for name, present in _present(engine).items()}
    engine.observers.append(KVAudit(engine, findings))
    SwapAudit(engine, findings)
    if engine.states is not None:
        engine.states = StateAudit(engine.states, engine, findings, atol=state_atol)
    return Audit(gen, config, prompts, max_new_tokens, k, model, findings, options)


def _present(engine) -> dict[str, bool]:
    """Which stores this engine has (the model's and the configuration's facts, not a policy's)."""
    kv = engine.target.num_layers > 0
    return {"kv": kv, "kv_digests": kv,
            "ring": engine.sliding is not None and engine.sliding.ring_slots is not None,
            "recurrent_state": engine.states is not None, "conv_state": engine.states is not None,
            "draft_kv": engine.drafting, "prefix_cache": engine.prefix is not None,
            "head_cache": engine.prefix is not None and engine.drafting, "swap": True,
            "host_tier": engine.prefix is not None and engine.prefix.host is not None,
            "handoff": False}     # one engine: nothing handed off (audit.moved.audit_handoff audits a hand-off)
