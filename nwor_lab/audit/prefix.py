"""The stores whose blocks outlive a window's request: the prefix cache, the head's cache of a hit,
and swapped-out blocks (engine observers and scheduler-hook wrappers; nothing a strategy declares
is read).

- `prefix_cache`: after every verify window, every registered block (`engine.prefix.allocator`
  `.hash_of`) is looked at. Its token prefix is found by hashing the requests' tokens
  (`kv.prefix.chain_hashes`: the chained hash names the whole prefix). Named when (a) a running
  request holds it at a position past its committed length (`registered_past_commit`), (b) its
  target layers changed after it was registered (`written_after_registration`), or (c), checked
  after the run, its target layers differ from target-only's block for the same tokens by more
  than `tolerance` (`differs_from_target_only`; a rejected draft's K/V in a registered row is far
  beyond it). Target-only's blocks: a target-only engine with prefix caching prefilling the
  tokens (the reference `ReferenceBlocks`). `tolerance` is calibrated as `bench state` calibrates
  its own: the larger of the asked tolerance and the *noise floor*, the largest difference between
  target-only's blocks written by decoding the same workload (one row a pass) and by prefilling it
  -- what the target's arithmetic alone moves (0 or about 1e-6 in float32 on the CPU).
- `head_cache`: each request admitted with a hit of h tokens (`engine.prefix.hits`), at its first
  verify window's end: the head's K/V (cache layer `head.layer_index`) at positions 0..h-1 of its
  block table, against what target-only + head hold there: the same head prefilling tokens 0..h
  with no prefix caching (`head_reference`), within the same tolerance.
- `swap`: a request swapped out (`engine.scheduler.on_preempt` with `request.swapped` set): the
  bytes of its blocks (every layer) and of a hybrid target's state slot as they left the device;
  when it is swapped in (`on_resume`), its new blocks and slot are compared with them bit for bit
  (a finding's window is the step of the swap-in, its kind `swap_in`).
"""
from __future__ import annotations

import torch

from nwor_lab.audit.report import StoreFinding
from nwor_lab.kv.prefix import chain_hashes
from nwor_lab.ops.quant import raw


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


class PrefixAudit:
    """Engine observer for `prefix_cache` and `head_cache` (`engine.observers.append(...)`); `finish`
    after the run compares with target-only (`ReferenceBlocks`, `head_reference`)."""

    def __init__(self, engine, findings: dict[str, StoreFinding]):
        self.engine, self.findings = engine, findings
        self.bs = engine.cache.spec.block_size
        self.num_target = engine.target.num_layers
        self.head_layer = engine.head.layer_index if engine.drafting else None
        self.blocks: dict[tuple, dict] = {}       # (hash, block) -> {tokens, step, keys, values}
        self.hits: dict[int, dict] = {}           # req_id -> {tokens, h, step, keys, values} (head rows)
        self._hashes: dict[int, tuple] = {}       # req_id -> (tokens length, chain hashes)
        self.retired: list[dict] = []             # blocks seen registered, since evicted (still compared)
        if engine.prefix is not None:
            # an evicted block is written again by its next holder: what it held is kept for `finish`
            al = engine.prefix.allocator
            inner = al.on_evict

            def on_evict(block, h):
                for key in [key for key in self.blocks if key[1] == block]:
                    self.retired.append(self.blocks.pop(key))
                if inner is not None:
                    inner(block, h)
            al.on_evict = on_evict

    def on_phase(self, e) -> None:
        pass

    def on_window_end(self, engine, trace, window) -> None:
        if trace.kind == "verify":
            self.look(trace.step)

    def _tokens_of(self) -> dict[bytes, list[int]]:
        sched = self.engine.scheduler
        out = {}
        for r in (*sched.running, *sched.finished, *sched.waiting):
            n, hashes = self._hashes.get(r.req_id, (-1, None))
            if n != len(r.tokens):
                hashes = chain_hashes(r.tokens, self.bs)
                self._hashes[r.req_id] = (len(r.tokens), hashes)
            for i, h in enumerate(hashes):
                out.setdefault(h, r.tokens[:(i + 1) * self.bs])
        return out

    def look(self, step: int) -> None:
        """The registered blocks now (and the hit requests seen for the first time)."""
        caching = self.engine.prefix
        if caching is None:
            return
        al, cache, finding = caching.allocator, self.engine.cache, self.findings["prefix_cache"]
        for r in self.engine.scheduler.running:
            for i, b in enumerate(r.block_table.blocks):
                if b in al.hash_of and (i + 1) * self.bs > r.num_computed:
                    finding.reach(step, "verify", {"why": "registered_past_commit", "request": r.req_id, "block": i,
                                                   "physical_block": b, "committed": r.num_computed})
        tokens = None
        for b, h in list(al.hash_of.items()):
            keys, values = cache.key[:self.num_target, b], cache.value[:self.num_target, b]
            seen = self.blocks.get((h, b))
            if seen is None:
                tokens = self._tokens_of() if tokens is None else tokens
                self.blocks[(h, b)] = dict(hash=h, block=b, tokens=tokens.get(h), step=step, keys=keys.clone(),
                                           values=values.clone())
                finding.rows_checked += self.bs
            elif not (torch.equal(raw(keys), raw(seen["keys"])) and torch.equal(raw(values), raw(seen["values"]))):
                finding.reach(step, "verify", {"why": "written_after_registration", "physical_block": b,
                                               "registered_in": seen["step"]})
                seen["keys"], seen["values"] = keys.clone(), values.clone()
        if self.head_layer is None:
            return
        key, value = cache.layer(self.head_layer)
        for r in self.engine.scheduler.running:
            h = caching.hits.get(r.req_id, 0)
            if h <= 0 or r.req_id in self.hits:
                continue
            pos = torch.arange(h)
            blocks = torch.tensor(r.block_table.blocks, dtype=torch.long)[pos // self.bs]
            self.hits[r.req_id] = dict(tokens=r.tokens[:h + 1], h=h, step=step,
                                       keys=key[blocks, pos % self.bs].clone(), values=value[blocks, pos % self.bs].clone())
            self.findings["head_cache"].rows_checked += h

    def finish(self, reference: "ReferenceBlocks", head_rows: dict[int, tuple] | None, tolerance: float) -> None:
        """After the run: each registered block against target-only's, each hit's head rows against
        `head_rows` (req_id -> (keys [h,H,D], values)), both within `tolerance`."""
        self.look(self.engine.step_index)
        finding = self.findings["prefix_cache"]
        seen_all = [(h, b, s) for (h, b), s in self.blocks.items()] + [(s["hash"], s["block"], s) for s in self.retired]
        for h, b, seen in sorted(seen_all, key=lambda x: x[2]["step"]):
            want = reference.block(h)
            if want is None:
                continue
            diff = max(_max_diff(seen["keys"], want[0]), _max_diff(seen["values"], want[1]))
            if diff > tolerance:
                per = ((seen["keys"].float() - want[0].float()).abs().amax((-1, -2))
                       + (seen["values"].float() - want[1].float()).abs().amax((-1, -2)))   # [L, BS]
                layer, row = divmod(int(per.argmax()), self.bs)
                position = len(seen["tokens"]) - self.bs + row if seen["tokens"] else None
                finding.reach(seen["step"], "verify", {"why": "differs_from_target_only", "physical_block": b,
                                                       "layer": layer, "row": row, "position": position,
                                                       "max_abs_diff": float(f"{diff:.6g}"), "tolerance": tolerance})
        if head_rows is None:
            return
        finding = self.findings["head_cache"]
        for req_id, seen in sorted(self.hits.items(), key=lambda kv: kv[1]["step"]):
            k0, v0 = head_rows[req_id]
            per = ((seen["keys"].float() - k0.float()).abs().amax((-1, -2))
                   + (seen["values"].float() - v0.float()).abs().amax((-1, -2)))             # [h]
            if float(per.max()) > tolerance:
                p = int(per.argmax())
                finding.reach(seen["step"], "verify", {"request": req_id, "hit_tokens": seen["h"], "position": p,
                                                       "max_abs_diff": float(f"{float(per.max()):.6g}"),
                                                       "tolerance": tolerance})


class ReferenceBlocks:
    """Target-only's registered blocks for token prefixes: a target-only engine (k = 0) with prefix
    caching prefills each of `prefixes` (one request at a time, so a later one hits the earlier ones'
    blocks, which are target-only's too). `block(h)` -> (keys, values) `[L, BS, H, D]` or None."""

    def __init__(self, target, config, prefixes: list[list[int]], block_size: int):
        from nwor_lab.engine import SpecEngine
        from nwor_lab.engine.prefix import PrefixCacheConfig
        longest = _maximal(prefixes, block_size)
        need = sum(len(p) // block_size + 2 for p in longest) + 1
        # its own prefix cache, never the audited engine's LabConfig.prefix_cache (a keyword contradicting a set field is refused)
        self.engine = SpecEngine(target, None, config.replace(prefix_cache=""), k=0, block_size=block_size,
                                 num_blocks=need, max_num_seqs=1,
                                 max_num_batched_tokens=max([len(p) for p in longest] + [1024]),
                                 prefix_cache=PrefixCacheConfig())
        for p in longest:
            self.engine.add_request(p, 1)
            self.engine.run()

    def block(self, h: bytes):
        b = self.engine.prefix.allocator.block_of.get(h)
        if b is None:
            return None
        L = self.engine.target.num_layers
        return self.engine.cache.key[:L, b], self.engine.cache.value[:L, b]


def _maximal(prefixes: list[list[int]], block_size: int) -> list[list[int]]:
    """The prefixes (cut to whole blocks) that are no prefix of another, longest first."""
    out, covered = [], set()
    for p in sorted((list(p[:len(p) // block_size * block_size]) for p in prefixes if p), key=len, reverse=True):
        hashes = chain_hashes(p, block_size)
        if not hashes or hashes[-1] in covered:
            continue
        covered.update(hashes)
        out.append(p)
    return out


def noise_floor(reference: ReferenceBlocks, decoded) -> float:
    """The largest difference between target-only's blocks written by decoding (`decoded`: a
    target-only engine with prefix caching that ran the workload) and by prefilling the same tokens."""
    al, L = decoded.prefix.allocator, decoded.target.num_layers
    floor = 0.0
    for b, h in al.hash_of.items():
        want = reference.block(h)
        if want is not None:
            floor = max(floor, _max_diff(decoded.cache.key[:L, b], want[0]), _max_diff(decoded.cache.value[:L, b], want[1]))
    return floor


def head_reference(target, head, config, k: int, hits: dict[int, dict], block_size: int) -> dict[int, tuple]:
    """What target-only + head hold at a hit's positions: the head prefilling each hit request's tokens
    0..h with no prefix caching, all in one step -> req_id -> (keys, values) `[h, H, D]` of the head's layer."""
    from nwor_lab.engine import SpecEngine
    if not hits:
        return {}
    items = sorted(hits.items())
    need = sum(len(s["tokens"]) // block_size + k // block_size + 3 for _, s in items) + 1
    e = SpecEngine(target, head, config.replace(prefix_cache=""), k=k, block_size=block_size, num_blocks=need,
                   max_num_seqs=len(items),
                   max_num_batched_tokens=max(1024, sum(len(s["tokens"]) for _, s in items)))
    reqs = [(req_id, s["h"], e.add_request(s["tokens"], 2)) for req_id, s in items]
    e.step()           # the prefill (one token emitted each, so every request still holds its blocks)
    key, value = e.cache.layer(e.head.layer_index)
    out: dict[int, tuple] = {}
    for req_id, h, r in reqs:
        pos = torch.arange(h)
        blocks = torch.tensor(r.block_table.blocks, dtype=torch.long)[pos // block_size]
        out[req_id] = (key[blocks, pos % block_size].clone(), value[blocks, pos % block_size].clone())
    return out


class SwapAudit:
    """Wraps the scheduler's `on_preempt` / `on_resume` hooks (install with `SwapAudit(engine, findings)`):
    what a swapped-out request's blocks (every layer) and state slot held as they left, against what
    its new blocks and slot hold after the swap-in, bit for bit."""

    def __init__(self, engine, findings: dict[str, StoreFinding]):
        self.engine, self.finding = engine, findings["swap"]
        sched = engine.scheduler
        self._preempt, self._resume = sched.on_preempt, sched.on_resume
        sched.on_preempt, sched.on_resume = self.on_preempt, self.on_resume
        self.left: dict[int, tuple] = {}          # req_id -> (blocks' keys, values, state or None, step)

    def _bytes(self, blocks: list[int], slot):
        cache = self.engine.cache
        idx = torch.tensor(blocks, dtype=torch.long, device=cache.device)
        state = None
        if slot is not None and self.engine.states is not None:
            store = self.engine.states.store
            state = (store.recurrent[:, slot].clone(), store.conv[:, slot].clone())
        return cache.key[:, idx].clone(), cache.value[:, idx].clone(), state

    def on_preempt(self, r) -> None:
        slot = r.state_slot
        before = self._bytes(r.block_table.blocks, slot) if r.block_table.blocks else None
        self._preempt(r)
        if r.swapped is not None and before is not None:
            self.left[r.req_id] = (*before, self.engine.step_index)

    def on_resume(self, r) -> None:
        self._resume(r)
        left = self.left.pop(r.req_id, None)
        if left is None:
            return
        keys, values, state, step = left
        now_k, now_v, now_state = self._bytes(r.block_table.blocks, r.state_slot)
        self.finding.rows_checked += keys.shape[1] * keys.shape[2]
        for layer in range(keys.shape[0]):
            k0, v0, k1, v1 = keys[layer], values[layer], now_k[layer], now_v[layer]
            if not (torch.equal(raw(k0), raw(k1)) and torch.equal(raw(v0), raw(v1))):
                diff = max(_max_diff(k0, k1), _max_diff(v0, v1))
                self.finding.reach(self.engine.step_index, "swap_in", {
                    "request": r.req_id, "layer": layer, "swapped_out_in": step, "max_abs_diff": float(f"{diff:.6g}")})
                return
        same = now_state is not None and state is not None and all(torch.equal(raw(a), raw(b))
                                                                     for a, b in zip(state, now_state))
        if state is not None and not same:
            self.finding.reach(self.engine.step_index, "swap_in", {"request": r.req_id, "state_slot": r.state_slot,
                                                                  "swapped_out_in": step})
