"""The paged K/V stores' byte check, as an engine observer: `kv` (the target's attention layers),
`draft_kv` (the EAGLE head's own layer, cache layer `target.num_layers`), `ring` (a sliding-window
ring's entries) and `kv_digests` (the content digests of every block a request holds).

The check generalises the invariant the policies' tests hold `cow` and `stage` to
(`policies.invariants.check_invariants`: every rejected slot bit-identical to before the window)
to every policy, whatever it declares: at each window's `begin` the raw bytes of the window's slots
are copied (every layer the window may write), and at its `commit` every rejected row's slot
(commit mask false, slot not -1) is compared with that copy. Accepted rows write their own slots,
so a rejected slot whose bytes changed holds what a rejected draft wrote: those bytes reached the
store. A window that restores them (`cow`) or never writes them (`stage`) leaves them equal.

- `ring` (a ring of S slots configured): a rejected row at position p lands in the slot of p - S;
  when p - S >= 0 that slot held committed K/V, which the write evicted (`still_needed`: the
  request's next query, at its committed length, still attends to p - S; `first_needed_window`: the
  first step in which an evicted entry was still needed).
- `kv_digests`: after each step (its verify window and its draft chain), the digest
  (`kv.block_digest`: every slot of the block, every layer) of each block a running request holds
  is compared with the digest of the same block with this step's rejected writes taken out (their
  slots' bytes from before the step): what a consumer that hashes, snapshots or ships whole blocks
  keys on. `full_block` says whether the block was wholly committed (a prefix cache's unit);
  `first_full_block_window` the first step in which a wholly committed block's digest changed.
"""
from __future__ import annotations

import torch

from nwor_lab.audit.report import StoreFinding
from nwor_lab.kv.digest import block_digest
from nwor_lab.ops.quant import raw


class _Block:
    """One block as `kv.digest.block_bytes` reads a cache: `num_layers` and `layer(l)` -> (key, value)
    `[1, BS, H, D]`, so `block_digest(_Block(...), 0)` hashes it exactly as it hashes a cache's block."""

    def __init__(self, keys: list, values: list):
        self.keys, self.values = keys, values
        self.num_layers = len(keys)

    def layer(self, layer: int):
        return self.keys[layer][None], self.values[layer][None]


class KVAudit:
    """Engine observer (`engine.observers.append(KVAudit(engine, findings))`); fills the findings of
    `kv`, `draft_kv`, `ring` and `kv_digests` (those present)."""

    def __init__(self, engine, findings: dict[str, StoreFinding]):
        self.engine = engine
        self.cache = engine.cache
        self.bs = engine.cache.spec.block_size
        self.head_layer = engine.head.layer_index if engine.drafting else None
        s = engine.sliding
        self.ring_slots = s.ring_slots if s is not None else None
        self.attend = s.size if s is not None else None
        self.findings = findings
        self._open = None              # the open window's copy: (rows, slots, {layer: (key, value)})
        self._step = None
        self._step_before: dict = {}   # (layer, slot) -> (key [H,D], value [H,D], kind) before the step's first write
        self._step_rejected = 0        # rejected rows (verify and draft windows) of the step

    # -- phases ---------------------------------------------------------------------------------
    def on_phase(self, e) -> None:
        if e.phase == "begin":
            self._begin(e)
        elif e.phase == "commit":
            self._commit(e)
        elif e.phase == "cancel":
            self._open = None

    def _begin(self, e) -> None:
        if self._step != self.engine.step_index:
            self._step, self._step_before, self._step_rejected = self.engine.step_index, {}, 0
        slots = e.window.slot_mapping
        rows = torch.nonzero(slots >= 0).flatten()
        s = slots[rows]
        block, offset = s // self.bs, s % self.bs
        copy = {}
        for layer in e.layers:
            key, value = self.cache.layer(layer)
            copy[layer] = (key[block, offset].clone(), value[block, offset].clone())     # [n, H, D]
        self._open = (rows, s, copy)

    def _commit(self, e) -> None:
        if self._open is None or e.acceptance is None:
            return
        rows, slots, copy = self._open
        self._open = None
        w = e.window
        rejected = ~e.acceptance.commit_mask[rows]                   # [n] of the window's real rows
        if not bool(rejected.any()):
            return
        self._step_rejected += int(rejected.sum())
        block, offset = slots // self.bs, slots % self.bs
        step, kind = self.engine.step_index, e.kind or "verify"
        positions = w.positions[rows] if w.positions is not None else None
        reached_rows = torch.zeros_like(rejected)
        for store in {"draft_kv" if layer == self.head_layer else "kv" for layer in copy}:
            self.findings[store].rows_checked += int(rejected.sum())     # rows, whatever the layer count
        for layer, (key0, value0) in copy.items():
            key, value = self.cache.layer(layer)
            changed = ((raw(key[block, offset]) != raw(key0)).flatten(1).any(1)
                       | (raw(value[block, offset]) != raw(value0)).flatten(1).any(1))
            hit = changed & rejected
            store = "draft_kv" if layer == self.head_layer else "kv"
            if bool(hit.any()):
                i = int(torch.nonzero(hit)[0])
                self.findings[store].reach(step, kind, self._where(w, rows, slots, positions, i, layer))
                reached_rows |= hit
                for j in torch.nonzero(hit).flatten().tolist():       # what the step's digests compare against
                    self._step_before.setdefault((layer, int(slots[j])), (key0[j], value0[j], kind))
        if self.ring_slots is not None and positions is not None:
            self._ring(e, rows, slots, positions, rejected, reached_rows, step, kind)

    def _ring(self, e, rows, slots, positions, rejected, reached_rows, step, kind) -> None:
        """Rejected rows whose write evicts a committed position (p - S >= 0) are the ring's to check."""
        evicts = rejected & (positions - self.ring_slots >= 0)
        finding = self.findings["ring"]
        finding.rows_checked += int(evicts.sum())
        hit = evicts & reached_rows
        if not bool(hit.any()):
            return
        needed = []                                   # per hit row: does the request's next query read p - S?
        for i in torch.nonzero(hit).flatten().tolist():
            nxt = self._committed_after(e, rows, i)
            needed.append((i, None if nxt is None else bool(int(positions[i]) - self.ring_slots > nxt - self.attend)))
        i, still = needed[0]
        detail = self._where(e.window, rows, slots, positions, i, None)
        detail.update(evicted_position=int(positions[i]) - self.ring_slots, still_needed=still,
                      first_needed_window=None)
        finding.reach(step, kind, detail)
        if any(n for _, n in needed) and finding.detail["first_needed_window"] is None:
            # the first step whose rejected write evicted an entry a later query still reads
            finding.detail["first_needed_window"] = step

    def _committed_after(self, e, rows, i) -> int | None:
        """The committed length of row i's request after the window (its next query's position)."""
        w = e.window
        if w.positions is None:
            return None
        req = w.token_req[rows[i]]
        mine = (w.token_req == req) & (w.slot_mapping >= 0)
        first = int(w.positions[mine].min())                      # t_last (verify) or the chain's base
        if e.kind == "draft":
            return first
        return first + int(e.acceptance.accepted_len[int(req)]) + 1

    def _where(self, w, rows, slots, positions, i, layer) -> dict:
        slot = int(slots[i])
        row = int(rows[i])
        detail = {"request": self._owner(slot // self.bs), "layer": layer, "slot": slot,
                  "position": None if positions is None else int(positions[i]),
                  "draft": int(w.token_draft_pos[row])}
        if layer is None:
            del detail["layer"]
        return detail

    def _owner(self, block: int) -> int | None:
        """The id of the running request whose block table holds `block`."""
        for r in self.engine.scheduler.running:
            if block in r.block_table.blocks:
                return r.req_id
        return None

    # -- after the step: the digests of the blocks each request holds ---------------------------
    def on_window_end(self, engine, trace, window) -> None:
        if trace.kind != "verify" or "kv_digests" not in self.findings:
            return
        finding = self.findings["kv_digests"]
        taken, self._step_before = self._step_before, {}
        finding.rows_checked += self._step_rejected
        self._step_rejected = 0
        by_block: dict[int, list] = {}
        for (layer, slot), before in taken.items():
            by_block.setdefault(slot // self.bs, []).append((layer, slot % self.bs, *before))
        for r in engine.scheduler.running:
            for i, b in enumerate(r.block_table.blocks):
                if b not in by_block:
                    continue
                keys, values = [], []
                for layer in range(self.cache.num_layers):
                    key, value = self.cache.layer(layer)
                    keys.append(key[b].clone())
                    values.append(value[b].clone())
                for layer, off, k0, v0, _ in by_block[b]:
                    keys[layer][off], values[layer][off] = k0, v0
                now, clean = block_digest(self.cache, b), block_digest(_Block(keys, values), 0)
                if now == clean:
                    continue
                kinds = {kind for *_, kind in by_block[b]}
                full = min((i + 1) * self.bs, self.ring_slots or (i + 1) * self.bs) <= r.num_computed
                finding.reach(trace.step, "verify" if "verify" in kinds else "draft",
                              {"request": r.req_id, "block": i, "physical_block": b, "full_block": full,
                               "digest": now, "accepted_only_digest": clean, "first_full_block_window": None})
                if full and finding.detail["first_full_block_window"] is None:
                    # a wholly committed block (what a prefix cache keys) whose bytes changed
                    finding.detail["first_full_block_window"] = trace.step

