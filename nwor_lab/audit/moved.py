"""The stores whose blocks leave the device and come back: the prefix cache's host tier and the
prefill-to-decode hand-off (nwor_lab.engine.offload, nwor_lab.disagg). Nothing a strategy declares
is read: the auditor looks at the bytes.

- `host_tier` (`HostTierAudit`, wrapping `HostTier.on_evict` / `HostTier._restore`): every block
  that comes back from host memory, store by store (`target layers`, `head layers`, and each row
  store kept beside a block: `boundary_feature`, `boundary_token`, `state.recurrent`, `state.conv`),
  against what left the device (bit for bit: `differs_from_what_left`, the store named); after the
  run (`finish`) its target layers against target-only's block for the same tokens, within the
  tolerance (`differs_from_target_only`: a rejected draft's K/V in a row is far beyond it). A store
  the offload does not keep (the head's layers under `target_only`) comes back as zeros: named.
- `handoff` (`audit_handoff`): what each shipped request holds on the decode side once installed
  (the rows `install` queues for its fresh blocks, and its state slot), against target-only's:
  committed rows of the target's layers against a target-only prefill (`differs_from_target_only`),
  of the head's layer against target-only + head (a write-none prefill of the same prompts:
  `head_differs_from_target_only`; `no_head` leaves zeros there), the state slot against
  target-only's (`state_differs_from_target_only`; `no_state` arrives cleared), and every shipped
  row past the committed length that holds a rejected draft's row (`rejected_row_shipped`: the
  prefill engine's `RejectedRows`, write-all's junk).
"""
from __future__ import annotations

import dataclasses

import torch

from nwor_lab.audit.report import AuditReport, StoreFinding
from nwor_lab.ops.quant import raw


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


class HostTierAudit:
    """Wraps an engine's host tier (`engine.prefix.host`): snapshots each block as it leaves and as it
    comes back, names the first store that differs; `finish(reference, tolerance)` compares the
    restored target layers with target-only's (`audit.prefix.ReferenceBlocks`)."""

    def __init__(self, engine, findings: dict[str, StoreFinding]):
        tier = engine.prefix.host
        self.engine, self.tier, self.finding = engine, tier, findings["host_tier"]
        self.left: dict[bytes, dict[str, torch.Tensor]] = {}    # hash -> store -> bytes as it left
        self.back: list[dict] = []                              # every restore: hash, block, step, stores
        evict, restore = tier.on_evict, tier._restore

        def on_evict(block, h):
            if h not in tier.pool:                  # (a hash the pool holds already is only touched)
                self.left[h] = self.stores(block)
            evict(block, h)

        def _restore(slots, blocks):
            restore(slots, blocks)
            for (_, h), b in zip(slots, blocks):
                self.check(h, b)
        tier.on_evict, tier._restore = on_evict, _restore

    def stores(self, block: int) -> dict[str, torch.Tensor]:
        """Every store of device `block` (all cache layers, all row stores prefix caching keeps), cloned."""
        cache, nt = self.engine.cache, self.engine.target.num_layers
        out = {"target layers": torch.stack([cache.key[:nt, block], cache.value[:nt, block]]).clone()}
        if cache.spec.num_layers > nt:
            out["head layers"] = torch.stack([cache.key[nt:, block], cache.value[nt:, block]]).clone()
        for name, (t, dim, _) in self.tier.all_rows.items():
            out[name] = t.select(dim, block).clone()
        return out

    def check(self, h: bytes, block: int) -> None:
        now = self.stores(block)
        step = self.engine.step_index
        self.back.append(dict(hash=h, block=block, step=step, keys=now["target layers"][0],
                              values=now["target layers"][1]))
        self.finding.rows_checked += self.engine.cache.spec.block_size
        left = self.left.get(h)
        if left is None:
            return
        for store, before in left.items():
            if not torch.equal(raw(before), raw(now[store])):
                self.finding.reach(step, "restore", {"why": "differs_from_what_left", "store": store,
                                                     "block_hash": h.hex()[:16], "physical_block": block,
                                                     "offload": self.tier.strategy.name})
                return

    def finish(self, reference, tolerance: float) -> None:
        """Each restored block's target layers against target-only's block for the same hash."""
        for seen in self.back:
            want = reference.block(seen["hash"])
            if want is None:
                continue
            diff = max(_max_diff(seen["keys"], want[0]), _max_diff(seen["values"], want[1]))
            if diff > tolerance:
                self.finding.reach(seen["step"], "restore", {"why": "differs_from_target_only", "store": "target layers",
                                                             "block_hash": seen["hash"].hex()[:16],
                                                             "physical_block": seen["block"],
                                                             "max_abs_diff": float(f"{diff:.6g}"),
                                                             "tolerance": tolerance})


# -- the hand-off ----------------------------------------------------------------------------------
def arrived(engine, request) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], tuple | None]:
    """What an installed, not yet resumed `request` will hold on the decode `engine`: per cache layer
    (keys, values) `[P, H, D]` by position (P = its blocks x block size), and its state or None."""
    saved = request.swapped
    if saved is None:
        raise ValueError("arrived: the request is not an installed shipment (install(...) it first, before it runs)")
    layers = {layer: (k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]))
              for layer, (k, v) in enumerate(zip(saved.keys, saved.values))}
    return layers, saved.state


def audit_handoff(target, head, config, prompts: list[list[int]], max_new_tokens: int, strategy="nwor", *,
                  k: int = 3, block_size: int = 16, tolerance: float = 1e-5, corrupt=None,
                  transport=None) -> AuditReport:
    """One hand-off (prefill engine -> `transport` -> decode engine, both built from `target`, `head`,
    `config` with `k`, `block_size`) audited request by request; the decode engine then runs and its
    tokens are compared with target-only's. `corrupt(shipments)`: a fault planted in the frames
    before they travel (a test's or a chapter's). -> AuditReport with the one store `handoff`
    (`run`: the strategy, bytes, junk rows and the acceptance)."""
    from nwor_lab.disagg import InProcess, handoff_strategy, install, prefill
    from nwor_lab.disagg.handoff import watch_rejected
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.generate import acceptance_stats
    from nwor_lab.engine.trace import first_divergence

    strategy = handoff_strategy(strategy)
    config = dataclasses.replace(config, cuda_graph=False)
    need = sum(-(-(len(p) + max_new_tokens + k + 1) // block_size) for p in prompts) + 1
    common = dict(k=k, block_size=block_size, num_blocks=need, max_num_seqs=len(prompts),
                  max_num_batched_tokens=max(1024, sum(len(p) for p in prompts)))
    build = lambda c, h: SpecEngine(target, h, c, **common)              # noqa: E731
    first = build(config, head)
    rejected = watch_rejected(first)
    shipped = prefill(first, prompts, max_new_tokens, strategy)
    if corrupt is not None:
        corrupt(shipped)
    # target-only (k = 0: its prefill has no draft chain) and target-only + head (write-none: only
    # committed rows reach the cache, the head's among them)
    plain = dataclasses.replace(config, nwor_mode="stage", debug=False)
    only = prefill(SpecEngine(target, None, plain, **{**common, "k": 0}), prompts, max_new_tokens, "nwor")
    with_head = prefill(build(plain, head), prompts, max_new_tokens, "nwor")

    transport = transport or InProcess()
    for s in shipped:
        transport.send(s)
    received = [transport.recv() for _ in shipped]
    second = build(config, head)
    reqs = [install(second, s) for s in received]

    finding = StoreFinding("handoff", True)
    nt = target.num_layers
    for i, (s, r) in enumerate(zip(received, reqs)):
        if r is None:
            continue
        layers, state = arrived(second, r)
        n = s.header["num_computed"]
        for layer, (kk, vv) in layers.items():
            ref = only[i] if layer < nt else with_head[i]
            if f"key.{layer}" not in ref.tensors:
                continue
            want_k, want_v = ref.tensors[f"key.{layer}"][:n], ref.tensors[f"value.{layer}"][:n]
            per = ((kk[:n].float() - want_k.float()).abs().flatten(1).amax(1)
                   + (vv[:n].float() - want_v.float()).abs().flatten(1).amax(1))          # [n]
            finding.rows_checked += n
            if n and float(per.max()) > tolerance:
                p = int(per.argmax())
                why = "differs_from_target_only" if layer < nt else "head_differs_from_target_only"
                finding.reach(0, "handoff", {"why": why, "request": i, "layer": layer, "position": p,
                                             "block": p // block_size, "strategy": strategy.name,
                                             "max_abs_diff": float(f"{float(per.max()):.6g}"), "tolerance": tolerance})
        want_state = with_head[i].tensors.get("state.recurrent")
        if want_state is not None:
            got = state[0] if state is not None else None
            if got is None or not torch.equal(raw(got.cpu()), raw(want_state)):
                finding.reach(0, "handoff", {"why": "state_differs_from_target_only", "request": i,
                                             "store": "state.recurrent", "shipped": got is not None,
                                             "strategy": strategy.name})
        for row in s.header["rejected_rows_shipped"]:
            finding.reach(0, "handoff", {"why": "rejected_row_shipped", "request": i, "strategy": strategy.name,
                                         **{key: row[key] for key in ("position", "block", "layers")}})
    second.run()
    tokens = [list(s.header["output"]) if r is None else list(r.output) for s, r in zip(received, reqs)]
    ref_engine = SpecEngine(target, None, plain, **{**common, "k": 0})
    ref_reqs = [ref_engine.add_request(p, max_new_tokens) for p in prompts]
    ref_engine.run()
    ids = None if any(r is None for r in reqs) else [r.req_id for r in reqs]
    d = first_divergence(tokens, [r.output for r in ref_reqs], trace=second.trace if ids else None, req_ids=ids)
    divergence = None if d is None else {"request": d.prompt, "token": d.token, "expected": d.want, "got": d.got,
                                         "window": d.window}
    mean = acceptance_stats(second.trace, second.k)[0] if second.k else 1.0
    run = {"strategy": strategy.name, "transport": transport.name, "nwor_mode": config.nwor_mode, "k": k,
           "prompts": len(prompts), "max_new_tokens": max_new_tokens, "block_size": block_size,
           "kv_bytes": sum(s.kv_bytes for s in received), "junk_rows": sum(s.header["junk_rows"] for s in received),
           "mean_acceptance_length": mean, "tolerance": tolerance, "rejected_slots_seen": len(rejected.slots)}
    return AuditReport([finding], divergence, run)
