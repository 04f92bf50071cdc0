"""A tree window through a commit strategy, phase by phase, as `Frame`s the `Stepper` draws.

`tree_demo(seed)` builds one small request: a committed prefix at positions 0 .. n - 1, t_last at n,
an EAGLE-2-shaped tree of N nodes (dynamic_tree over seeded random draft log-probabilities), random
K/V per window row and layer, and the target's logits made so that greedy tree acceptance
(`accept_tree_greedy`) keeps the best-first path of `accepted` nodes. `tree_frames(strategy, demo)`
runs it through the strategy's write policy (`off` = write-all + move, `cow`, `stage`, or `remap`:
write-all + a block-size-1 table) and returns the frames: begin, one write per layer, acceptance,
commit.

What a slot holds is read from the cache's bits after each phase, never assumed: a slot whose bits are
window row j's K/V is WRITTEN while the fate is open, then COMMITTED if row j is t_last or on the path
and the slot is its position n + depth (the compaction done), else REJECTED (a rejected node, or a
path node's stale copy the move left behind); a slot written during the window whose bits are the old
ones again is RESTORED (cow's log). Under remap the table, not the bits, decides: the path's slots are
re-pointed (COMMITTED where they are), the rejected nodes' slots are freed (OLD). Frames carry
`region_slots`: the slots of positions n .. n + N.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.ops import write_kv
from nwor_lab.policies.tree import STRATEGY_TITLES, TREE_STRATEGIES, RemapPolicy, tree_policy
from nwor_lab.speculative.tree_accept import accept_tree_greedy
from nwor_lab.speculative.tree_draft import dynamic_tree
from nwor_lab.speculative.tree_window import TreeWindow, depths_of
from nwor_lab.viz.recorder import Frame
from nwor_lab.viz.states import SlotState, log_rows, raw, staging_rows

__all__ = ["TreeDemo", "TreeFrame", "tree_demo", "tree_frames", "STRATEGY_TITLES"]



@dataclass
class TreeDemo:
    parents: list            # [N] node i+1 -> 0 .. i
    tokens: list             # [N] the nodes' draft tokens
    t_last: int
    prefix: int              # n: positions 0 .. n - 1 are committed before the window
    logits: torch.Tensor     # [N + 1, V] the target's logits after each row (greedy acceptance reads them)
    key: torch.Tensor        # [L, N + 1, H, D] each window row's K per layer (t_last first)
    value: torch.Tensor
    prefix_key: torch.Tensor  # [L, n, H, D]
    prefix_value: torch.Tensor
    block_size: int

    @property
    def num_layers(self) -> int:
        return self.key.shape[0]


@dataclass(frozen=True)
class TreeFrame(Frame):
    region_slots: tuple = ()     # slots of positions n .. n + N


def tree_demo(seed: int = 0, *, nodes: int = 9, topk: int = 3, depth: int = 4, accepted: int = 2, prefix: int = 5,
              block_size: int = 4, num_layers: int = 2, vocab: int = 40) -> TreeDemo:
    """One small request with a drafted tree (module doc); `accepted` nodes on the greedy path."""
    g = torch.Generator().manual_seed(seed)

    def step(tokens, parent_rows, level):
        return torch.log_softmax(2 * torch.randn(*tokens.shape, vocab, generator=g), -1)

    tree = dynamic_tree(step, torch.log_softmax(2 * torch.randn(1, vocab, generator=g), -1), topk, depth, nodes)
    parents, tokens = tree.parents[0].tolist(), tree.tokens[0].tolist()
    logits = torch.randn(nodes + 1, vocab, generator=g)
    at = 0
    for _ in range(accepted):              # the target agrees with the best-first child at each depth
        child = next((i + 1 for i, p in enumerate(parents) if p == at), None)
        if child is None:
            break
        logits[at, tokens[child - 1]] = 10.0
        at = child
    # the rows after the path: an argmax no child carries (the path stops there)
    for row in range(nodes + 1):
        if logits[row].max() < 10:
            used = {tokens[i] for i, p in enumerate(parents) if p == row}
            free = next(t for t in range(vocab) if t not in used)
            logits[row, free] = 10.0
    H, D = 1, 4
    kv = 1 + torch.rand(2, num_layers, nodes + 1 + prefix, H, D, generator=g)    # never zero: zero is "empty"
    return TreeDemo(parents, tokens, int(torch.randint(vocab, (1,), generator=g)), prefix, logits,
                    kv[0, :, prefix:], kv[1, :, prefix:], kv[0, :, :prefix], kv[1, :, :prefix], block_size)


def tree_frames(strategy: str, demo: TreeDemo | None = None, *, seed: int = 0) -> list[TreeFrame]:
    """The frames of `demo` (default `tree_demo(seed)`) committed by `strategy` (move, cow, stage, remap)."""
    demo = demo if demo is not None else tree_demo(seed)
    N, n, L = len(demo.parents), demo.prefix, demo.num_layers
    bs = 1 if TREE_STRATEGIES[strategy].block_size_one else demo.block_size
    blocks = -(-(n + N + 1 + bs) // bs)
    cache = PagedKVCache(KVCacheSpec(L, blocks, bs, demo.key.shape[2], demo.key.shape[3]))
    table = torch.arange(blocks, dtype=torch.int32)[None]
    pre_slots = torch.arange(n)
    for l in range(L):
        write_kv(demo.prefix_key[l], demo.prefix_value[l], *cache.layer(l), pre_slots)
    w = TreeWindow.build([demo.parents], table, [n], bs, torch.tensor(demo.tokens))
    policy = tree_policy(strategy, cache, LabConfig(attention="torch"))
    rec = _Recording(strategy, demo, cache, w, policy, pre_slots)
    policy.begin(w)
    rec.snap("begin")
    for l in range(L):
        policy.write(l, demo.key[l], demo.value[l])
        rec.delivered[l] = True
        rec.snap("write", layer=l)
    verdict = accept_tree_greedy(w, demo.logits)
    acc = verdict.acceptance(w)
    rec.acceptance, rec.path = acc, acc.draft_mask.tolist()
    rec.snap("acceptance")
    policy.commit(acc)
    if isinstance(policy, RemapPolicy):     # its commit leaves the table to re-point
        rec.table = policy.remap(table, torch.tensor([n]))[0]
    rec.snap("commit")
    return rec.frames


class _Recording:
    def __init__(self, strategy, demo, cache, w, policy, pre_slots):
        self.strategy, self.demo, self.cache, self.w, self.policy = strategy, demo, cache, w, policy
        self.region = w.slot_mapping.tolist()               # positions n .. n + N (write-all order)
        self.base = {l: self._bits(l) for l in range(demo.num_layers)}
        self.rows = {l: torch.cat([raw(demo.key[l]).flatten(1), raw(demo.value[l]).flatten(1)], 1)
                     for l in range(demo.num_layers)}
        self.committed = set(pre_slots.tolist())
        self.touched = {l: [False] * len(self.region) for l in range(demo.num_layers)}
        self.delivered = {l: False for l in range(demo.num_layers)}
        self.depth = [0] + depths_of(demo.parents)
        self.acceptance, self.path, self.table = None, None, None
        self.frames = []
        self.in_buffer = policy.window_in_buffer
        self.logged = policy.preserves_rejected_slots and not policy.window_in_buffer   # cow's log

    def _bits(self, l):
        k, v = self.cache.layer(l)
        s = torch.tensor(self.region)
        bs = self.cache.spec.block_size
        return torch.cat([raw(k[s // bs, s % bs]).flatten(1), raw(v[s // bs, s % bs]).flatten(1)], 1)

    def _kept(self, j: int) -> bool:
        return j == 0 or bool(self.path[j - 1])

    def _mark(self, j: int) -> str:
        name = "t" if j == 0 else f"n{j}"
        if self.path is None or j == 0:
            return name
        return name + ("✓" if self._kept(j) else "✗")

    def snap(self, phase: str, layer: int | None = None) -> None:
        cache, bs = self.cache, self.cache.spec.block_size
        N = len(self.region) - 1
        n = self.demo.prefix
        done = phase == "commit"
        states, labels, marks = {}, {}, {}
        for l in range(self.demo.num_layers):
            grid = torch.full((cache.spec.num_blocks * bs,), int(SlotState.EMPTY), dtype=torch.int8)
            grid[list(self.committed)] = SlotState.COMMITTED
            now = self._bits(l)
            for i, s in enumerate(self.region):
                match = [j for j in range(N + 1) if torch.equal(now[i], self.rows[l][j])]
                same = torch.equal(now[i], self.base[l][i])
                self.touched[l][i] |= not same
                if match:
                    j = match[0]
                    if not done:
                        state = SlotState.WRITTEN
                    elif self.strategy == "remap":
                        state = SlotState.COMMITTED if self._kept(j) else SlotState.OLD
                    else:
                        home = self._kept(j) and n + self.depth[j] == n + i
                        state = SlotState.COMMITTED if home else SlotState.REJECTED
                    grid[s] = state
                    if l == 0:
                        marks[s] = self._mark(j)
                        labels[s] = self._label(j, i, state)
                elif same:
                    if self.touched[l][i] and done:
                        grid[s] = SlotState.RESTORED
                        if l == 0:
                            labels[s] = f"position n + {i}: written this window, the old bits restored from the log"
                else:
                    grid[s] = SlotState.OLD
            states[l] = grid.view(-1, bs)
        T = N + 1
        kept = None if self.acceptance is None else self.acceptance.commit_mask.bool()
        staging, log = {}, {}
        for l in range(self.demo.num_layers):
            if self.in_buffer:
                staging[l] = staging_rows(torch.full((T,), self.delivered[l]), kept, finished=done)
            if self.logged:
                logged = torch.tensor([False] + [True] * N)        # the N node slots
                stays = kept       # log_rows: an entry of a row that does not "stay" was restored
                if done:           # a tree's log restores the slots no path row moves into (rows past a)
                    stays = torch.cat([torch.tensor([True]), self.w.restore_slots(self.acceptance) < 0])
                log[l] = log_rows(logged, stays, finished=done)
        w = self.w
        host = dataclasses.replace(w, **{f.name: getattr(w, f.name).cpu() for f in dataclasses.fields(w)
                                         if isinstance(getattr(w, f.name), torch.Tensor)})
        self.frames.append(TreeFrame(
            index=len(self.frames), window_index=0, phase=phase, kind="verify",
            mode=STRATEGY_TITLES[self.strategy], caption=self._caption(phase, layer, states[0], marks), block_size=bs, window=host,
            window_layers=range(self.demo.num_layers), states=states, labels=labels, marks=marks, layer=layer,
            rows=range(0, T) if phase == "write" else None, acceptance=self.acceptance, staging=staging, log=log,
            region_slots=tuple(self.region)))

    def _label(self, j: int, i: int, state) -> str:
        who = "t_last" if j == 0 else f"node {j} (depth {self.depth[j]}, token {self.demo.tokens[j - 1]})"
        if state == SlotState.REJECTED:
            what = "a stale copy: the move copied this path node to n + its depth" if self._kept(j) else \
                "rejected K/V left in the block"
        else:
            what = {SlotState.WRITTEN: "written, fate open", SlotState.COMMITTED: "committed at its position n + depth",
                    SlotState.OLD: "freed: the table no longer points here"}.get(state, "")
        return f"position n + {i} holds {who}: {what}"

    def _caption(self, phase: str, layer, grid0, marks) -> str:
        N, name = len(self.region) - 1, STRATEGY_TITLES[self.strategy]
        a = 0 if self.path is None else sum(self.path)
        if phase == "begin":
            extra = {"stage": "the nodes will wait in the staging buffer, the cache is not touched",
                     "cow": f"the old contents of the {N} node slots are saved to the log",
                     "move": "every node will be written at n + its row", "remap": "every node will be written at "
                     "n + its row (block size 1: one block per position)"}[self.strategy]
            return f"{name}: tree window begins: t_last + {N} nodes; {extra}"
        if phase == "write":
            where = "to the staging buffer, cache untouched" if self.in_buffer else \
                f"into the cache at positions n .. n + {N} (write-all order: node j at n + j)"
            return f"{name}: layer {layer}: t_last and {N} nodes written {where}"
        if phase == "acceptance":
            return (f"{name}: greedy tree acceptance: the path keeps {a} of {N} nodes (✓), depths 1 .. {a}; "
                    f"their K/V belong at positions n + 1 .. n + {a}")
        moved = self.w.path_moves(self.acceptance.draft_mask)
        moves = int((moved[1] >= 0).sum())
        rows = f"{moves} path row{'s' if moves != 1 else ''}"
        left = [marks.get(s, "") for s in self.region if int(grid0.reshape(-1)[s]) == SlotState.REJECTED]
        stale = sum(m.endswith("✓") for m in left)
        behind = f"{len(left) - stale} rejected node{'s' if len(left) - stale != 1 else ''}" + \
            (f" and {stale} stale cop{'ies of moved path nodes' if stale != 1 else 'y of a moved path node'}" if stale else "")
        return {"move": f"{name}: commit: {rows} copied to n + 1 .. n + {a} (gather + scatter, two launches); "
                        f"{behind} stay in the cache behind the path, in its block and beyond",
                "cow": f"{name}: commit: the log restores every slot past the path, then {rows} moved in: "
                       f"three launches, nothing rejected left",
                "stage": f"{name}: commit: t_last and the {a} path nodes written straight from the buffer to "
                         f"n .. n + {a} (one launch: the compaction is the commit); {N - a} rejected nodes never "
                         f"reached the cache",
                "remap": f"{name}: commit: nothing moves; the block table is re-pointed so n + 1 .. n + {a} are the "
                         f"path's slots, and the {N - a} rejected nodes' blocks are freed"}[self.strategy]
