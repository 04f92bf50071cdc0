"""A tree window's commit, strategy by strategy, and what each one costs.

| strategy          | class                  | what the commit does                                      |
| ---               | ---                    | ---                                                       |
| write-all + move  | `OffPolicy`            | every node written at n + row; accepted rows copied to n + 1 .. n + a |
| write-all + remap | `RemapPolicy` (BS = 1) | every node written; the block table re-pointed at the accepted slots |
| cow               | `CowPolicy`            | log the N node slots, write all, restore, then move      |
| stage             | `StagePolicy`          | nodes in the staging buffer; the path committed to n + 1 .. n + a in one launch |

`RemapPolicy` writes like `off` and moves nothing: its commit leaves the cache as written and
`remap_block_tables` (or `policy.remap(block_tables)`) gives the table whose positions n + 1 .. n + a
point at the accepted nodes' blocks, and the blocks to free. It needs block size 1 (a block per
position), the one case where re-pointing is exact; it is not registered as an `nwor_mode`, since
the engine would have to apply the table it returns (see the module's `tree_commit_costs`).
"""
from __future__ import annotations

import torch

from dataclasses import dataclass

from nwor_lab.config import LabConfig
from nwor_lab.policies.cow import CowPolicy
from nwor_lab.policies.off import OffPolicy
from nwor_lab.policies.policy import WritePolicy
from nwor_lab.policies.stage import StagePolicy
from nwor_lab.window import Acceptance, Window



class RemapPolicy(OffPolicy):
    """Write-all, then re-point a block-size-1 table at the accepted rows (SGLang at page size 1)."""

    def __init__(self, cache, *args, **kwargs):
        if cache.spec.block_size != 1:
            raise ValueError(f"RemapPolicy: block_size={cache.spec.block_size}; re-pointing the table at "
                             f"accepted rows is exact only with one position per block (block_size=1); use "
                             f"write-all + move (off) or stage at larger blocks")
        super().__init__(cache, *args, **kwargs)
        self.last_remap = None       # (window, acceptance) of the last committed window

    def _commit(self, acceptance) -> None:
        self.last_remap = (self.window, acceptance)    # nothing moves in the cache

    def remap(self, block_tables: torch.Tensor, context_lens: torch.Tensor):
        """`remap_block_tables` for the last committed window."""
        if self.last_remap is None:
            raise RuntimeError("remap: commit a window first")
        return remap_block_tables(block_tables, context_lens, *self.last_remap)


@dataclass(frozen=True)
class TreeStrategy:
    """One way to commit a tree window: its `title` (what rows, figures and chapters call it), the
    write policy class that commits it, and whether it needs block size 1 (re-pointing a table is
    exact only with a block per position)."""

    title: str
    policy: type[WritePolicy]
    block_size_one: bool = False


# The tree commit strategies, by name (their colours: nwor_lab.viz.tree.STRATEGY_COLOURS, by title)
TREE_STRATEGIES = {"move": TreeStrategy("write-all+move", OffPolicy),
                   "remap": TreeStrategy("write-all+remap", RemapPolicy, block_size_one=True),
                   "cow": TreeStrategy("cow", CowPolicy), "stage": TreeStrategy("stage", StagePolicy)}
STRATEGIES = tuple(TREE_STRATEGIES)
STRATEGY_TITLES = {name: s.title for name, s in TREE_STRATEGIES.items()}


def tree_policy(strategy: str, cache, config: LabConfig | None = None, **kwargs) -> WritePolicy:
    """The write policy that commits tree windows under `strategy` (one of STRATEGIES) over `cache`;
    `config`'s other settings kept, its nwor_mode the policy's own; `kwargs` as WritePolicy's."""
    if strategy not in TREE_STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {', '.join(STRATEGIES)}")
    cls = TREE_STRATEGIES[strategy].policy
    return cls(cache, (config or LabConfig()).replace(nwor_mode=cls.name), **kwargs)


def remap_block_tables(block_tables: torch.Tensor, context_lens: torch.Tensor, window: Window,
                       acceptance: Acceptance) -> tuple[torch.Tensor, torch.Tensor]:
    """Block size 1: `(tables, freed)`.

    block_tables `[R, max_blocks]` (block b of position p is `tables[r, p]`), context_lens `[R]`
    the position n of each request's t_last. Returns a new table whose positions n + 1 .. n + a hold
    the accepted nodes' blocks (positions past n + a: -1, no longer part of the sequence), and
    freed `[Dtot]` the rejected nodes' blocks (-1 for accepted ones). No host sync.
    """
    dev = block_tables.device
    r = window.draft_req.long().to(dev)
    depth = window.token_depth[window.draft_rows].long() if window.is_tree else \
        window.token_draft_pos[window.draft_rows].long()
    blocks = window.draft_slots.to(dev)                     # block size 1: slot == block id
    n = context_lens.to(dev).long()[r]
    mask = acceptance.draft_mask.to(dev)
    tables = block_tables.clone()
    # the draft positions n + 1 .. n + N first leave the sequence, then the path moves in (rows of
    # accepted nodes are distinct (request, depth) pairs: no two writes to one entry)
    row_pos = n + window.token_draft_pos[window.draft_rows].long()
    tables[r, row_pos] = -1
    col = torch.where(mask, n + depth, row_pos)
    tables[r[mask], col[mask]] = blocks[mask].to(tables.dtype)
    return tables, blocks.masked_fill(mask, -1)


def tree_commit_costs(strategy: str, window: Window, acceptance: Acceptance, *, num_layers: int,
                      bytes_per_row: int, block_size: int, context_lens) -> dict:
    """Host numbers for one committed tree window under `strategy` (one of STRATEGIES).

    rows_written_per_token    cache rows written per layer (verify writes, restores and move
                              destinations) per token the window emits (accepted nodes + the bonus)
    bytes_moved               bytes copied inside the cache to compact the path, all layers
    rejected_bytes_in_blocks  rejected rows left in the block that holds the path's last position
                              (positions n + a + 1 .. up to the block's end), all layers: the bytes a
                              prefix cache or a digest of that block would see. Blocks wholly past
                              the path hold only rejected rows and can be freed or reused.
    context_lens[r]: position n of request r's t_last.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {', '.join(STRATEGIES)}")
    acc = acceptance.accepted_per_request()
    moves = window.path_moves(acceptance.draft_mask)
    moved = int((moves[1] >= 0).sum()) if moves is not None else 0
    restored = int((window.restore_slots(acceptance) >= 0).sum())
    rows = {"stage": sum(1 + a for a in acc)}
    write_all = sum(1 + n for n in window.num_draft_tokens)
    rows.update(move=write_all + moved, remap=write_all, cow=write_all + restored + moved)
    left = 0
    if strategy == "move":           # the others: restored (cow), never written (stage), freed (remap)
        for n_r, a, n in zip(window.num_draft_tokens, acc, [int(c) for c in context_lens]):
            block_end = -(-(n + a + 1) // block_size) * block_size      # one past the path's last block
            left += max(0, min(n + n_r + 1, block_end) - (n + a + 1))
    tokens = sum(1 + a for a in acc)
    return {"strategy": strategy, "nodes": max(window.num_draft_tokens, default=0), "accepted_len": acc,
            "rows_written_per_token": rows[strategy] / max(1, tokens),
            "bytes_moved": (moved if strategy in ("move", "cow") else 0) * num_layers * bytes_per_row,
            "rejected_bytes_in_blocks": left * num_layers * bytes_per_row}
