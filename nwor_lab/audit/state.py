"""The recurrent and conv state stores' byte check: a wrapper around the engine's state policy.

`StateAudit(engine.states, ...)` forwards every call to the strategy and keeps what it needs to
recompute, independently of the strategy, what the store must hold after each verify window:
  - at `begin`, each request's committed state and conv state (`store.committed(slot)`);
  - each linear layer's inputs as the model hands them over (`conv(layer, x, weight)`,
    `recur(layer, *inputs)`: gated DeltaNet's q, k, v, g, beta);
  - after `commit`, for each request with `a` accepted drafts of `d`, over its `s` rows: the store's
    recurrence (`spec.recurrence.run`: for gated DeltaNet `ops.gated_delta_rule`, token by token up
    to 16 rows) from the committed state over its first `s - d + a` rows only, and the conv state
    as the last W - 1 conv inputs of those rows.
The store's committed rows are compared with that: bit for bit on the CPU (the torch reference; every exact
strategy leaves exactly these bits, docs/recurrent_state.md), within `atol` (default 1e-4) on CUDA,
where fla's kernels (or the reference over other batch shapes) may round differently. A difference means the store took a rejected
draft's update. The strategy's own declarations are never read.
"""
from __future__ import annotations

import torch

from nwor_lab.audit.report import StoreFinding
from nwor_lab.ops.quant import raw


class StateAudit:
    """Wraps a `StatePolicy` (install with `engine.states = StateAudit(engine.states, engine, findings)`);
    fills the findings of `recurrent_state` and `conv_state`."""

    def __init__(self, inner, engine, findings: dict[str, StoreFinding], atol: float | None = None):
        self._inner, self._engine, self._findings = inner, engine, findings
        # bit for bit on the CPU (the torch reference, token by token: docs/recurrent_state.md); on CUDA
        # (fla's kernels, or the reference over other batch shapes) the recompute may round differently
        exact = inner.store.device.type == "cpu"
        self.atol = (0.0 if exact else 1e-4) if atol is None else float(atol)
        self._open = None
        # request windows where the store differs from the accepted-only state although no draft was
        # rejected (a prefill, or every draft accepted): not a rejected write, so no store is named;
        # counted so that a strategy (or recompute) that goes wrong there is not hidden
        self.unexplained = 0

    def __getattr__(self, name):             # store, window, layers, spec, ...: the strategy's own
        return getattr(self._inner, name)

    def begin(self, window, slots, layers=None, **kw) -> None:
        self._inner.begin(window, slots, layers, **kw)
        host_slots = slots.tolist() if torch.is_tensor(slots) else [int(s) for s in slots]
        qsl, drafts = kw.get("query_start_loc"), kw.get("num_drafts")
        if qsl is None:
            qsl = [0]
            for n in window.num_scheduled_tokens:
                qsl.append(qsl[-1] + n)
            drafts = list(window.num_draft_tokens)
        qsl = qsl.tolist() if torch.is_tensor(qsl) else [int(v) for v in qsl]
        drafts = drafts.tolist() if torch.is_tensor(drafts) else [int(v) for v in drafts]
        store = self._inner.store
        before = [tuple(t.clone() for t in store.committed(s)) for s in host_slots]   # ([L,H,K,V], [L,W-1,C])
        self._open = dict(slots=host_slots, qsl=qsl, drafts=drafts, before=before, conv={}, recur={})

    def conv(self, layer, x, weight):
        if self._open is not None:
            self._open["conv"][layer] = x.detach().clone()
        return self._inner.conv(layer, x, weight)

    def recur(self, layer, *inputs, **options):
        if self._open is not None:
            self._open["recur"][layer] = (tuple(t.detach().clone() for t in inputs), options)
        return self._inner.recur(layer, *inputs, **options)

    def cancel(self) -> None:
        self._open = None
        self._inner.cancel()

    def commit(self, acceptance=None) -> None:
        self._inner.commit(acceptance)
        opened, self._open = self._open, None
        if opened is None:
            return
        accepted = [0] * len(opened["slots"]) if acceptance is None else \
            [int(a) for a in acceptance.accepted_len.tolist()]
        self._check(opened, accepted)

    # -- the check ------------------------------------------------------------------------------
    def _check(self, o: dict, accepted: list[int]) -> None:
        step = self._engine.step_index
        store, spec = self._inner.store, self._inner.spec
        width = spec.conv_width
        rec, conv = self._findings["recurrent_state"], self._findings["conv_state"]
        for r, slot in enumerate(o["slots"]):
            start, end = o["qsl"][r], o["qsl"][r + 1]
            d = o["drafts"][r]
            if end <= start:
                continue                                        # a padding request: no rows
            a = min(accepted[r], d)
            kept = (end - start) - d + a                         # t_last (or the prefill) and the accepted drafts
            state0, conv0 = o["before"][r]
            now_state, now_conv = store.committed(slot)
            if d - a:
                rec.rows_checked += d - a
                conv.rows_checked += d - a
            for layer in sorted(o["recur"]):
                inputs, options = o["recur"][layer]
                rows = slice(start, start + kept)
                _, states = spec.recurrence.run(state0[layer][None], tuple(t[None, rows] for t in inputs), options,
                                                kept - 1, self._inner.backend)
                want = states[0, -1].to(now_state.dtype)
                diff = _differs(now_state[layer], want, self.atol)
                if diff is not None:
                    self._found(rec, step, r, slot, layer, a, d, diff)
            for layer in sorted(o["conv"]):
                x = o["conv"][layer]
                history = torch.cat([conv0[layer].to(x.dtype), x[start:start + kept]], 0)
                want = history[kept:kept + width - 1].to(now_conv.dtype)
                diff = _differs(now_conv[layer], want, 0.0)
                if diff is not None:
                    self._found(conv, step, r, slot, layer, a, d, diff)

    def _found(self, finding: StoreFinding, step: int, r: int, slot: int, layer: int, a: int, d: int,
               diff: float) -> None:
        if d - a:
            finding.reach(step, "verify", self._where(r, slot, layer, a, d, diff))
        else:
            self.unexplained += 1

    def _where(self, r: int, slot: int, layer: int, a: int, d: int, diff: float) -> dict:
        """Where: the request (its id: the running request holding the state slot), the slot, the
        linear layer, the window's acceptance, how far the store is from the accepted-only state."""
        owner = next((q.req_id for q in self._engine.scheduler.running if q.state_slot == slot), None)
        return {"request": owner, "state_slot": slot, "layer": layer, "accepted": a, "drafts": d,
                "max_abs_diff": diff}


def _differs(now: torch.Tensor, want: torch.Tensor, atol: float) -> float | None:
    """None when `now` equals `want` (bit for bit at atol 0), else the largest absolute difference."""
    if atol == 0.0:
        if torch.equal(raw(now.contiguous()), raw(want.contiguous())):
            return None
    elif torch.allclose(now.float(), want.float(), rtol=0.0, atol=atol):
        return None
    return float(f"{float((now.float() - want.float()).abs().max()):.6g}")
