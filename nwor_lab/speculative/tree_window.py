"""Tree windows: `t_last` plus N draft nodes per request, each node with a parent and a depth.

A tree window schedules, per request, `[t_last, node_1 .. node_N]` (parents before children: a
node's parent is t_last (0) or an earlier node). Node i sits at position `n + depth_i` (n = the
position of t_last), so siblings share a position; a chain is the tree with one child per node.

Two slot maps per row, both `[T] int64`, -1 = padding:
    slot_mapping   where a WRITE-ALL window puts row j of a request: position n + j (each row its own
                   slot, SGLang / TensorRT-LLM order). `stage` never writes there.
    commit_slots   where the row belongs if accepted: position n + depth. The accepted path (node
                   indices i1 < .. < ia, depths 1 .. a) ends at positions n + 1 .. n + a.
Moving the accepted path from `slot_mapping` to `commit_slots` is the **compaction**: write-all pays
it as a copy after verify, remap re-points a block-size-1 table, and `stage` does it as its commit.

Attention: a node attends the cache prefix (positions < n) and its ancestors (t_last included) and
itself. `ancestors [T, words] int64` holds that as a bitmask over the request's window rows: bit
j % 64 of word j // 64 of row t is set iff the request's row j is an ancestor of t or t itself
(`attention_bits`). Positions passed to RoPE and to the attention's prefix mask are `n + depth`.

The accepted path's draft mask is ancestor-closed with one node per depth 1..a (not prefix-closed
in row order, as a chain's is): `TreeWindow.acceptance_error` checks that rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from nwor_lab._checks import INDEX_DTYPES, check_tensor
from nwor_lab.kv.blocks import build_slot_mapping
from nwor_lab.window import Window

BITS = 64      # rows per ancestor word (int64)


def words_for(rows: int) -> int:
    """int64 words of an ancestor bitmask over `rows` window rows."""
    return max(1, -(-rows // BITS))


def _signed(bits: int) -> int:
    """An unsigned 64-bit pattern as the int64 torch stores (bit 63 is the sign)."""
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def check_parents(name: str, parents) -> list[int]:
    """`parents[i]` of node i+1: 0 (t_last) or an earlier node 1..i. Returns them as ints."""
    if type(parents) in (list, tuple) and _well_formed(tuple(parents)):
        return list(parents)
    out = []
    for i, p in enumerate(parents):
        if isinstance(p, bool) or not hasattr(p, "__index__"):
            raise TypeError(f"{name}[{i}]={p!r}: expected an int (0 = t_last, j = node j)")
        p = p.__index__()
        if not 0 <= p <= i:
            raise ValueError(f"{name}[{i}]={p}: node {i + 1}'s parent must be t_last (0) or an earlier node "
                             f"1..{i} (nodes are listed parents first)")
        out.append(p)
    return out


@lru_cache(maxsize=256)
def _well_formed(parents: tuple) -> bool:
    return all(type(p) is int and 0 <= p <= i for i, p in enumerate(parents))


def depths_of(parents: list[int]) -> list[int]:
    """Depth of each node (t_last is depth 0) from checked parents."""
    return list(_depths(tuple(parents)))


@lru_cache(maxsize=256)
def _depths(parents: tuple) -> tuple:
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    return tuple(depth[1:])


def ancestor_rows(parents: list[int]) -> list[set[int]]:
    """For rows 0..N (0 = t_last): the set of rows each one attends in the window (ancestors, itself)."""
    anc = [{0}]
    for i, p in enumerate(parents, start=1):
        anc.append(anc[p] | {i})
    return anc


def attention_bits(parents: list[int], words: int) -> list[list[int]]:
    """`[N + 1][words]` int64 ancestor bitmask of one request's rows (see the module doc)."""
    return _bits(tuple(parents), words)


@lru_cache(maxsize=256)
def _bits(parents: tuple, words: int) -> list[list[int]]:
    # a batch usually repeats one tree shape (a static tree, EAGLE-2's fixed node count)
    out = []
    for rows in ancestor_rows(parents):
        w = [0] * words
        for j in rows:
            w[j // BITS] |= 1 << (j % BITS)
        out.append([_signed(x) for x in w])
    return out


def chain_parents(k: int) -> list[int]:
    """The chain d_1 .. d_k as a tree: node i's parent is node i - 1."""
    return list(range(k))


@dataclass
class TreeWindow(Window):
    """A verify window of trees (see the module doc). Extra fields, all `[T]` unless said:

    token_depth    int32  depth of each row (t_last 0, node i its depth)
    token_parent   int64  window row of the parent (-1 for t_last)
    commit_slots   int64  slot of position n + depth (-1 padding)
    ancestors      [T, words] int64  attention bitmask over the request's rows
    node_parents   list[list[int]]  host copy of each request's parents (node i+1 -> 0 .. i)
    `token_draft_pos` keeps its meaning of the row's index inside the request (0 = t_last, j = node
    j): the write-all slot of row j is position n + j.
    """

    token_depth: torch.Tensor | None = None
    token_parent: torch.Tensor | None = None
    commit_slots_: torch.Tensor | None = None
    ancestors: torch.Tensor | None = None
    node_parents: list | None = None
    depth_bound: int = 0          # host bounds of a window built on the device (from_tensors)
    children_bound: int = 0

    @classmethod
    def from_parents(cls, parents, write_slots: torch.Tensor, commit_slots: torch.Tensor,
                     draft_token_ids: torch.Tensor | None = None) -> "TreeWindow":
        """parents: per request, a list of each node's parent (0 = t_last, j = node j, parents first).
        write_slots / commit_slots `[T]`: each row's slot at position n + row / n + depth, request
        by request (`[t_last, node_1 .. node_N]`). draft_token_ids `[Dtot]`: the nodes' tokens."""
        parents = [check_parents(f"parents[{r}]", p) for r, p in enumerate(parents)]
        counts = [len(p) for p in parents]
        base = Window.from_counts([1 + n for n in counts], counts, write_slots, draft_token_ids)
        check_tensor("commit_slots", commit_slots, shape=tuple(write_slots.shape), dtypes=INDEX_DTYPES,
                     device=write_slots.device, what="[num_tokens]: slot of position n + depth per row")
        words = words_for(1 + max(counts, default=0))
        depth, parent_row, bits, start = [], [], [], 0
        for p in parents:
            depth += (0, *_depths(tuple(p)))
            parent_row += [-1] + [start + q for q in p]
            bits += attention_bits(p, words)
            start += 1 + len(p)
        dev = write_slots.device
        if draft_token_ids is not None:
            _check_sibling_tokens(parents, draft_token_ids)
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        return cls(**fields, token_depth=torch.tensor(depth, dtype=torch.int32).to(dev),
                   token_parent=torch.tensor(parent_row, dtype=torch.int64).to(dev),
                   commit_slots_=commit_slots.long(),
                   ancestors=torch.tensor(bits, dtype=torch.int64).reshape(-1, words).to(dev),
                   node_parents=parents)

    @classmethod
    def build(cls, parents, block_tables: torch.Tensor, context_lens, block_size: int,
              draft_token_ids: torch.Tensor | None = None) -> "TreeWindow":
        """From each request's block table row `[R, max_blocks]` and `context_lens[r]` = n, the
        position of its t_last: write slots at n + row, commit slots at n + depth."""
        parents = [check_parents(f"parents[{r}]", p) for r, p in enumerate(parents)]
        dev = block_tables.device
        req, row_pos, depth_pos = [], [], []
        for r, (p, n) in enumerate(zip(parents, context_lens)):
            req += [r] * (1 + len(p))
            row_pos += [int(n) + j for j in range(1 + len(p))]
            depth_pos += [int(n)] + [int(n) + d for d in depths_of(p)]
        req = torch.tensor(req, dtype=torch.long, device=dev)
        write = build_slot_mapping(block_tables, req, torch.tensor(row_pos, device=dev), block_size)
        commit = build_slot_mapping(block_tables, req, torch.tensor(depth_pos, device=dev), block_size)
        return cls.from_parents(parents, write, commit, draft_token_ids)

    @classmethod
    def from_tensors(cls, parents: torch.Tensor, write_slots: torch.Tensor, commit_slots: torch.Tensor,
                     draft_token_ids: torch.Tensor, max_depth: int, max_children: int) -> "TreeWindow":
        """A batch of same-size trees built on the device, no host sync (a graphed step's window).

        parents `[R, N]` int64: node i+1's parent (0 = t_last, j = node j, j <= i). A request with fewer
        nodes pads with parent 0, token -1 and slot -1 (never written, never accepted).
        write_slots / commit_slots `[R * (N + 1)]`, draft_token_ids `[R * N]`.
        max_depth / max_children: host bounds (EAGLE-2: depth, topk) that fix every loop's length.
        Depths, ancestor bits and the children table come from `max_depth` gathers.
        """
        R, N = parents.shape
        dev = parents.device
        T = R * (N + 1)
        base = Window(slot_mapping=write_slots.long(),
                      token_req=torch.arange(R, device=dev, dtype=torch.int32).repeat_interleave(N + 1),
                      token_draft_pos=torch.arange(N + 1, device=dev, dtype=torch.int32).repeat(R),
                      draft_rows=(torch.arange(R, device=dev)[:, None] * (N + 1) + 1 +
                                  torch.arange(N, device=dev)[None, :]).flatten(),
                      num_scheduled_tokens=[N + 1] * R, num_draft_tokens=[N] * R, draft_token_ids=draft_token_ids)
        par = torch.cat([torch.zeros(R, 1, dtype=torch.long, device=dev), parents.long()], 1)   # row 0: itself
        words = words_for(N + 1)
        rows = torch.arange(N + 1, device=dev)
        own = torch.zeros(N + 1, words, dtype=torch.long, device=dev)
        own[rows, rows // BITS] = torch.ones_like(rows) << (rows % BITS)
        own = own[None].expand(R, N + 1, words)
        depth = torch.zeros(R, N + 1, dtype=torch.long, device=dev)
        anc = own.clone()
        is_node = (rows > 0)[None, :]
        for _ in range(max_depth):          # each pass settles one more level
            depth = torch.where(is_node, depth.gather(1, par) + 1, 0)
            anc = torch.where(is_node[..., None], own | anc.gather(1, par[..., None].expand(R, N + 1, words)), own)
        # children: rank of a node among its earlier siblings, scattered into [R, N + 1, K]
        same = (par[:, 1:, None] == par[:, None, 1:]) & torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)
        rank = same.sum(2)                                                   # [R, N]
        k = max(1, int(max_children))
        table = torch.full((R, N + 2, k), -1, dtype=torch.long, device=dev)  # row N + 1: overflow, dropped
        tgt = torch.where(rank < k, par[:, 1:], N + 1)
        table[torch.arange(R, device=dev)[:, None], tgt, rank.clamp(max=k - 1)] = \
            (torch.arange(R, device=dev)[:, None] * (N + 1) + 1 + torch.arange(N, device=dev)[None, :])
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        w = cls(**fields, token_depth=depth.flatten().to(torch.int32),
                token_parent=torch.where(is_node, par + (torch.arange(R, device=dev) * (N + 1))[:, None], -1).flatten(),
                commit_slots_=commit_slots.long(), ancestors=anc.reshape(T, words),
                depth_bound=int(max_depth), children_bound=k)
        w._children = table[:, :N + 1].reshape(T, k)
        return w

    @classmethod
    def on_device(cls, parents: torch.Tensor, draft_token_ids: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, block_size: int, max_depth: int, max_children: int) -> "TreeWindow":
        """`from_tensors` with the slots made here, no host sync (the one step body's window):
        block_tables `[R, max_blocks]`, context_lens `[R]` the position n of each t_last; write slots at
        n + row, commit slots at n + depth."""
        R, N = parents.shape
        dev = parents.device
        req = torch.arange(R, device=dev).repeat_interleave(N + 1)
        n = context_lens.to(dev).long()[req]
        row = torch.arange(N + 1, device=dev).repeat(R)
        write = build_slot_mapping(block_tables, req, n + row, block_size)
        w = cls.from_tensors(parents, write, write, draft_token_ids, max_depth, max_children)
        w.commit_slots_ = build_slot_mapping(block_tables, req, n + w.token_depth.long(), block_size)
        return w

    def parents_host(self) -> list[list[int]]:
        """Each request's parents as host lists (node i+1 -> 0 .. i); one sync for a device-built window."""
        if self.node_parents is None:
            parent = self.token_parent.cpu().tolist()
            out, start = [], 0
            for n in self.num_draft_tokens:
                out.append([parent[start + 1 + i] - start for i in range(n)])
                start += 1 + n
            self.node_parents = out
        return self.node_parents

    # -- what differs from a chain -------------------------------------------------------------
    @property
    def is_tree(self) -> bool:
        return True

    @property
    def commit_slots(self) -> torch.Tensor:
        return self.commit_slots_

    @property
    def max_depth(self) -> int:
        """A host bound on every node's depth (the number of gathers a walk up the tree needs)."""
        if self.depth_bound:
            return self.depth_bound
        return max((max(depths_of(p), default=0) for p in self.node_parents), default=0)

    @property
    def max_children(self) -> int:
        """The most children any row has (host bound for the stochastic walk)."""
        return self.children.shape[1]

    @property
    def children(self) -> torch.Tensor:
        """[T, K] int64 each row's children (window rows, in index order), -1 padded; K = the most
        children any row has (>= 1). Made on the host once (a graphed step builds it before capture)."""
        if getattr(self, "_children", None) is None:
            parent = self.token_parent.cpu()
            nodes = (parent >= 0).nonzero().flatten()
            par = parent[nodes]
            order = torch.sort(par, stable=True).indices          # children grouped by parent, index order
            nodes, par = nodes[order], par[order]
            first = torch.searchsorted(par, par)                  # first child of the same parent
            rank = torch.arange(len(par)) - first
            k = int(rank.max()) + 1 if len(par) else 1
            table = torch.full((self.num_tokens, k), -1, dtype=torch.long)
            table[par, rank] = nodes
            self._children = table.to(self.token_req.device)
        return self._children

    @property
    def query_positions_offset(self) -> torch.Tensor:
        """[T] int64 depth of each row: its RoPE / mask position is n + this."""
        return self.token_depth.long()

    def commit_mask_from(self, accepted_len: torch.Tensor) -> torch.Tensor:
        raise ValueError("TreeWindow: a tree's commit mask follows from the accepted path (a draft mask), not "
                         "from accepted lengths; use Acceptance.from_draft_mask(window, path_mask)")

    def commit_mask_for(self, draft_mask: torch.Tensor, accepted_len: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(self.num_tokens, dtype=torch.bool, device=draft_mask.device)
        return keep.index_put((self.draft_rows.to(draft_mask.device),), draft_mask)

    def restore_slots(self, acceptance) -> torch.Tensor:
        """[Dtot] the draft slots (write-all order) that no accepted row moves into: slots of rows j
        > a_r, which hold nothing after the compaction (-1 elsewhere)."""
        acc = acceptance.accepted_len.long().to(self.token_req.device)
        index = self.token_draft_pos[self.draft_rows].long()
        return self.draft_slots.masked_fill(index <= acc[self.draft_req.long()], -1)

    def path_moves(self, draft_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(src, dst)` `[Dtot]` slots: each accepted node's write-all slot and its commit slot
        (-1 for rejected nodes and for nodes already in place)."""
        src = self.draft_slots
        dst = self.commit_slots[self.draft_rows]
        move = draft_mask.to(src.device) & (src != dst)
        return src.masked_fill(~move, -1), dst.masked_fill(~move, -1)

    def acceptance_error(self, draft_mask: torch.Tensor, accepted_len: torch.Tensor) -> str | None:
        """Why `draft_mask` is not an accepted root path of `accepted_len[r]` nodes per request (host)."""
        mask = draft_mask.cpu().tolist()
        acc = accepted_len.cpu().tolist()
        d0 = 0
        for r, p in enumerate(self.parents_host()):
            nodes = [i + 1 for i in range(len(p)) if mask[d0 + i]]
            depth = depths_of(p)
            if sorted(depth[i - 1] for i in nodes) != list(range(1, len(nodes) + 1)) or len(nodes) != acc[r] \
                    or any(p[i - 1] != 0 and p[i - 1] not in nodes for i in nodes):
                return (f"request {r}: accepted nodes {nodes} are not one root path of {acc[r]} nodes (depths "
                        f"1..a, each node's parent accepted or t_last)")
            d0 += len(p)
        return None


def _check_sibling_tokens(parents: list[list[int]], draft_token_ids: torch.Tensor) -> None:
    """Siblings carry distinct tokens: otherwise the accepted path is ambiguous."""
    ids, d0 = draft_token_ids.cpu().tolist(), 0
    for r, p in enumerate(parents):
        seen = {}
        for i, q in enumerate(p):
            t = ids[d0 + i]
            if t >= 0 and (q, t) in seen:
                raise ValueError(f"draft_token_ids: request {r}'s nodes {seen[(q, t)] + 1} and {i + 1} share parent "
                                 f"{q} and token {t}; siblings must carry distinct tokens")
            seen[(q, t)] = i
        d0 += len(p)
