"""State checkpoints at block boundaries: the recurrent and conv state after a committed block's last
row, kept beside the block, so a prefix hit on a hybrid target restores its state slot exactly
(prefix caching's "align" mode, vLLM #39809).

    block_states = BlockStates(spec, num_blocks, block_size)
    policy.block_states = block_states          # a StatePolicy then taps its windows: tap_conv, tap_recur
    ... windows run; at each commit, a committed row at a block's last offset writes its block's row
    block_states.restore(store, slot, block)    # a hit of blocks[0..b]: the state after block b

    recurrent [L, NB+1, *state_shape] float32   row b: the state after block b's last row
    conv      [L, NB+1, W-1, C]                 row b: the conv state there (a slice of the history)

Row NB is a scratch row: every tapped row that is not a committed block end is written there, so the
commit is one `index_copy_` per layer with no host sync. The pool is indexed by K/V block id: it is
bounded by the K/V pool (one state row per block, `nbytes`), and a checkpoint is evicted with its
block (a reused block's row is overwritten when its new end row commits).

Only committed rows write: the tap stages the states of block-end rows during the window and the
commit keeps row j of a request only if j <= its first candidate + its accepted drafts, so a rejected
draft's state never reaches a checkpoint. That is exact only when the window starts from a state that
holds committed rows only (the strategy's `commits_accepted_only`): under `off` the live state holds
earlier windows' rejected drafts, so every state after its first rejection is wrong (the engine
refuses prefix caching there).

Where the states come from:
- a window whose states are kept from its first row (a verify window: t_last, d_1 .. d_k; the
  device layout of a captured step keeps all Q rows): a gather of the rows the recurrence kept
  anyway, device code, no sync;
- a prefill (only its last row's state is kept): each request's rows run in **segments that end
  at its block ends** (the state after each segment is the checkpoint). Segmenting changes the
  arithmetic of a long run (the chunked form of gated DeltaNet chunks from the run's first row),
  so with checkpoints on every prefill is segmented the same way, at absolute block ends: a block
  state is then the same bits whether the prefix was prefilled whole, resumed from a hit, or
  re-prefilled later, and for block sizes up to the recurrence's `max_token_rows` every segment
  runs token by token, which no split changes (bit for bit the decode's state too). Running the
  whole prefill with every state kept would cost a state per prompt token; segments keep one per
  block, which is the checkpoint itself. This reads the prefill's slot mapping on the host (an
  eager step; a prefill is never captured).
"""
from __future__ import annotations

import torch

from nwor_lab.state.store import RecurrentSpec, RecurrentStateStore


class BlockStates:
    """The checkpoint pool and the tap a StatePolicy calls (`policy.block_states`)."""

    def __init__(self, spec: RecurrentSpec, num_blocks: int, block_size: int, device="cpu"):
        if not isinstance(spec, RecurrentSpec):
            raise TypeError(f"spec: expected a nwor_lab.state.RecurrentSpec, got {type(spec).__name__}")
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: expected an integer >= 1")
        self.spec, self.block_size, self.scratch = spec, block_size, num_blocks
        L = spec.num_layers
        self.recurrent = torch.zeros(L, num_blocks + 1, *spec.state_shape, device=device)
        self.conv = torch.zeros(L, num_blocks + 1, spec.conv_width - 1, spec.conv_dim, dtype=spec.dtype,
                                device=device)
        self._staged: list = []
        self._ends: dict = {}
        self.stats = dict(windows=0, restored=0, copied=0)

    @property
    def nbytes(self) -> int:
        return self.recurrent.nbytes + self.conv.nbytes

    # -- the tap (called by StatePolicy) ---------------------------------------------------------
    def block_ends(self, policy, grp) -> torch.Tensor:
        """`[G, s]` int64: the block id at each row that is a block's last row, the scratch row elsewhere
        (padding rows, rows that write no K/V slot)."""
        out = self._ends.get(grp)
        if out is None:
            slots = policy._rows(grp, policy.window.slot_mapping.long())
            end = (slots >= 0) & (slots.remainder(self.block_size) == self.block_size - 1)
            if grp.valid is not None:
                end = end & grp.valid
            out = self._ends[grp] = torch.where(end, slots.div(self.block_size, rounding_mode="floor"),
                                                torch.full_like(slots, self.scratch))
        return out

    def tap_recur(self, policy, layer: int, grp, state: torch.Tensor, rows: tuple, options: dict):
        """In place of `policy._run` for the group (the same shapes; a prefill runs in segments that
        end at its block ends, see the module docstring): stages the state after each block-end row."""
        blocks = self.block_ends(policy, grp)
        if grp.keep_from == 0:                   # the recurrence keeps every row's state anyway
            o, kept = policy._run(state, rows, options, keep_from=0)
            self._stage_all("recurrent", layer, grp, blocks, kept)
            return o, kept
        host = blocks.tolist()
        outs, keeps = [], []
        for g in range(grp.count):
            ends = [j for j, b in enumerate(host[g]) if b != self.scratch]
            o, kept, at_ends = self._segments(policy, state[g:g + 1], tuple(t[g:g + 1] for t in rows), options,
                                              ends, grp.rows, grp.keep_from)
            outs.append(o)
            keeps.append(kept)
            if ends:
                self._stage_rows("recurrent", layer, grp, g, [host[g][e] for e in ends], ends,
                                 torch.cat(at_ends))
        return torch.cat(outs), torch.cat(keeps)

    def tap_conv(self, policy, layer: int, grp, history: torch.Tensor) -> None:
        """history `[G, W-1+s, C]` (the conv state before the rows, then their inputs): stages the conv
        state after each block-end row, `history[:, e+1 : e+W]`."""
        blocks = self.block_ends(policy, grp)
        W, s = self.spec.conv_width, blocks.shape[1]
        if grp.keep_from == 0:
            after = history.unfold(1, W - 1, 1)[:, 1:s + 1].transpose(-1, -2)      # [G, s, W-1, C]
            self._stage_all("conv", layer, grp, blocks, after)
            return
        host = blocks.tolist()
        for g in range(grp.count):
            ends = [j for j, b in enumerate(host[g]) if b != self.scratch]
            if ends:
                after = torch.stack([history[g, e + 1:e + W] for e in ends])
                self._stage_rows("conv", layer, grp, g, [host[g][e] for e in ends], ends, after)

    def commit(self, accepted: torch.Tensor) -> None:
        """accepted `[R]` (device): keep each staged row j of request r with j <= first candidate + a_r."""
        for table, layer, blocks, req, row, limit, values in self._staged:
            idx = torch.where(row <= limit + accepted[req], blocks, self.scratch)
            pool = getattr(self, table)[layer]
            pool.index_copy_(0, idx, values.to(pool.dtype))
        self.stats["windows"] += 1
        self.cancel()

    def cancel(self) -> None:
        """Drop what the window staged (nothing of it is kept)."""
        self._staged, self._ends = [], {}

    # -- the engine's side -------------------------------------------------------------------------
    def restore(self, store: RecurrentStateStore, slot: int, block: int) -> None:
        """Set `slot`'s committed row to the state after `block` (a hit's last block)."""
        rec, conv = store.committed(slot)
        rec.copy_(self.recurrent[:, block])
        conv.copy_(self.conv[:, block])
        self.stats["restored"] += 1

    def copy(self, src: int, dst: int) -> None:
        """Block `dst` is a copy of block `src` (a private copy of a hit block): its checkpoint too."""
        self.recurrent[:, dst].copy_(self.recurrent[:, src])
        self.conv[:, dst].copy_(self.conv[:, src])
        self.stats["copied"] += 1

    # -- helpers -------------------------------------------------------------------------------------
    @staticmethod
    def _segments(policy, state, rows, options, ends, s, keep_from):
        """One request's rows (`[1, s, ...]`) run in segments ending at its block-end rows `ends`
        -> (o `[1, s, ...]`, the states kept from keep_from on `[1, s-keep_from, ...]`, the states
        after each end `[1, ...]` each)."""
        cuts = [e + 1 for e in ends if e + 1 < s] + [s]
        outs, keeps, after, start = [], [], {}, 0
        for stop in cuts:
            seg = tuple(t[:, start:stop] for t in rows)
            keeps_here = stop - 1 >= keep_from
            kf = max(keep_from, start) - start if keeps_here else stop - 1 - start
            o, kept = policy._run(state, seg, options, keep_from=kf)
            outs.append(o)
            if keeps_here:
                keeps.append(kept)
            state = kept[:, -1]
            after[stop - 1] = state
            start = stop
        return torch.cat(outs, 1), torch.cat(keeps, 1), [after[e] for e in ends]

    def _stage_all(self, table, layer, grp, blocks, values):
        """Every row of the group (blocks `[G, s]`, values `[G, s, ...]`)."""
        G, s = blocks.shape
        dev = blocks.device
        req = (torch.arange(G, device=dev) + grp.first)[:, None].expand(G, s)
        row = torch.arange(s, device=dev)[None].expand(G, s)
        limit = torch.as_tensor(grp.first_candidate, device=dev).reshape(-1, 1).expand(G, s)
        self._staged.append((table, layer, blocks.reshape(-1), req.reshape(-1), row.reshape(-1),
                             limit.reshape(-1), values.reshape(G * s, *values.shape[2:])))

    def _stage_rows(self, table, layer, grp, g, blocks, rows, values):
        """Request g of the group: `blocks`, `rows` host lists, values `[n, ...]`."""
        dev = values.device
        n = len(rows)
        self._staged.append((table, layer, torch.tensor(blocks, dtype=torch.long, device=dev),
                             torch.full((n,), grp.first + g, dtype=torch.long, device=dev),
                             torch.tensor(rows, dtype=torch.long, device=dev),
                             torch.full((n,), int(grp.first_candidate), dtype=torch.long, device=dev), values))
