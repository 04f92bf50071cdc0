"""The verify window (which scheduled token is which draft of which request) and its acceptance.

For a speculative request the scheduled tokens are `[t_last, d_1 .. d_k]`; its drafts are the
LAST `num_draft_tokens[r]` tokens of its span (vLLM's order). Prefill and plain-decode requests
have no drafts: all their tokens always commit. Per token we keep

    token_req       [T] int32  request index
    token_draft_pos [T] int32  0 = always commits (prefill, decode, t_last); j = draft d_j

so the commit mask is one gather and a compare on the device:
`commit_mask = token_draft_pos <= accepted_len[token_req]`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab._checks import INDEX_DTYPES, check_tensor, check_whole


class DraftCounts:
    """What the per-request draft counts `num_draft_tokens` (a host list, one entry per request) say,
    on the host without a device sync: shared by `Window` and `SpecDecodeMetadata`, which both carry
    them."""

    num_draft_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.num_draft_tokens)

    @property
    def num_drafts(self) -> int:
        """Dtot: the drafts of all requests."""
        return sum(self.num_draft_tokens)

    total_draft_tokens = num_drafts        # SpecDecodeMetadata's name for it

    @property
    def max_spec_len(self) -> int:
        """Most drafts of any request in the window (0 for an empty batch); sampled ids have
        `max_spec_len + 1` columns."""
        return max(self.num_draft_tokens, default=0)


@dataclass
class Window(DraftCounts):
    slot_mapping: torch.Tensor        # [T] int64, -1 = padding
    token_req: torch.Tensor           # [T] int32
    token_draft_pos: torch.Tensor     # [T] int32
    draft_rows: torch.Tensor          # [Dtot] int64: token index of each draft, request-major
    num_scheduled_tokens: list[int]   # [R] host
    num_draft_tokens: list[int]       # [R] host
    draft_token_ids: torch.Tensor | None = None  # [Dtot], when known (SCV needs them)
    cu_draft: torch.Tensor | None = None           # [R] int32 inclusive cumsum, when the metadata has it
    positions: torch.Tensor | None = None          # [T] int64 position of each token, when known (on a
                                                   #   ring, what a row's write evicts follows from it)

    @classmethod
    def from_counts(cls, num_scheduled_tokens, num_draft_tokens, slot_mapping: torch.Tensor,
                    draft_token_ids: torch.Tensor | None = None) -> "Window":
        """Build from per-request counts (host lists) and the window's slot mapping `[T]`."""
        sched, drafts = [int(x) for x in num_scheduled_tokens], [int(x) for x in num_draft_tokens]
        if len(sched) != len(drafts):
            raise ValueError(f"num_draft_tokens: {len(drafts)} entries but num_scheduled_tokens has "
                             f"{len(sched)}; give one count per request")
        for r, (s, d) in enumerate(zip(sched, drafts)):
            if d < 0 or s < 1 or (d > 0 and s < d + 1):
                raise ValueError(f"request {r}: {s} scheduled tokens cannot hold {d} drafts "
                                 f"(a speculative request schedules t_last plus its drafts)")
        check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, what="[num_tokens]")
        if slot_mapping.numel() != sum(sched):
            raise ValueError(f"slot_mapping: {slot_mapping.numel()} entries but the requests schedule "
                             f"{sum(sched)} tokens")
        req, pos, rows = [], [], []
        start = 0
        for r, (s, d) in enumerate(zip(sched, drafts)):
            req += [r] * s
            pos += [0] * (s - d) + list(range(1, d + 1))
            rows += range(start + s - d, start + s)
            start += s
        dev = slot_mapping.device
        if draft_token_ids is not None:
            check_tensor("draft_token_ids", draft_token_ids, shape=(sum(drafts),), dtypes=INDEX_DTYPES,
                         device=dev, what="[total drafts] (SpecDecodeMetadata.draft_token_ids)")
        return cls(slot_mapping=slot_mapping.long(),
                   token_req=torch.tensor(req, dtype=torch.int32).to(dev),
                   token_draft_pos=torch.tensor(pos, dtype=torch.int32).to(dev),
                   draft_rows=torch.tensor(rows, dtype=torch.int64).to(dev),
                   num_scheduled_tokens=sched, num_draft_tokens=drafts, draft_token_ids=draft_token_ids)

    @classmethod
    def from_metadata(cls, metadata, cu_num_scheduled_tokens, slot_mapping: torch.Tensor,
                      positions: torch.Tensor | None = None) -> "Window":
        """From vLLM-style `SpecDecodeMetadata` and inclusive `cu_num_scheduled_tokens` `[R]`: the
        draft counts, draft ids and their cumsum are the metadata's own tensors, not recounted.
        positions `[T]`: each token's position, when the caller has them."""
        cu = [int(x) for x in (cu_num_scheduled_tokens.tolist() if torch.is_tensor(cu_num_scheduled_tokens)
                               else cu_num_scheduled_tokens)]
        sched = [b - a for a, b in zip([0] + cu[:-1], cu)]
        dev = slot_mapping.device
        window = cls.from_counts(sched, metadata.num_draft_tokens, slot_mapping,
                                 metadata.draft_token_ids.to(dev))
        window.cu_draft = metadata.cu_num_draft_tokens.to(dev)
        window.positions = None if positions is None else positions.to(dev).long()
        return window

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_req)

    @property
    def draft_slots(self) -> torch.Tensor:
        """[Dtot] slots of the drafts (what CoW logs and may restore)."""
        return self.slot_mapping[self.draft_rows]

    @property
    def draft_req(self) -> torch.Tensor:
        """[Dtot] request index of each draft."""
        return self.token_req[self.draft_rows]

    @property
    def cu_num_draft_tokens(self) -> torch.Tensor:
        """[R] int32 inclusive cumulative draft counts (vLLM's cu_num_draft_tokens)."""
        if self.cu_draft is None:
            c = torch.tensor(self.num_draft_tokens, dtype=torch.int32).cumsum(0).to(torch.int32)
            self.cu_draft = c.to(self.slot_mapping.device)
        return self.cu_draft

    def commit_mask_from(self, accepted_len: torch.Tensor) -> torch.Tensor:
        """[T] bool: keep a token iff it is not a draft or its draft index <= accepted_len."""
        return self.token_draft_pos <= accepted_len.to(self.token_req.device)[self.token_req.long()]

    # -- what a tree window (nwor_lab.speculative.tree_window.TreeWindow) answers differently ----------------------
    @property
    def is_tree(self) -> bool:
        return False

    @property
    def commit_slots(self) -> torch.Tensor:
        """[T] where each row belongs once accepted: a chain commits rows where it writes them."""
        return self.slot_mapping

    def commit_mask_for(self, draft_mask: torch.Tensor, accepted_len: torch.Tensor) -> torch.Tensor:
        """[T] bool commit mask of an acceptance (a chain's follows from the accepted lengths)."""
        return self.commit_mask_from(accepted_len)

    def restore_slots(self, acceptance: "Acceptance") -> torch.Tensor:
        """[Dtot] draft slots that must get their old rows back after the window (-1: keep): a
        chain's rejected drafts."""
        return self.draft_slots.masked_fill(acceptance.draft_mask.to(self.slot_mapping.device), -1)

    def path_moves(self, draft_mask: torch.Tensor):
        """`(src, dst)` slots an accepted row must move between after a write-all window, or None:
        a chain's accepted drafts already sit at their positions."""
        return None

    def acceptance_error(self, draft_mask: torch.Tensor, accepted_len: torch.Tensor) -> str | None:
        """Why `draft_mask` does not follow the prefix rule for `accepted_len` (host), or None."""
        draft_pos = self.token_draft_pos[self.draft_rows]
        if not bool((draft_mask == (draft_pos <= accepted_len.long()[self.draft_req.long()])).all()):
            return ("not the prefix d_1..d_a of each request's drafts that accepted_len says; a draft is "
                    "accepted only if every earlier one was (the prefix rule)")
        return None

    def accepted_len_from(self, draft_mask: torch.Tensor) -> torch.Tensor:
        """[R] int32 accepted lengths from a prefix-closed draft mask `[Dtot]` (no host sync)."""
        acc = torch.zeros(self.num_reqs, dtype=torch.int32, device=draft_mask.device)
        return acc.index_add_(0, self.draft_req.long().to(draft_mask.device), draft_mask.to(torch.int32))


@dataclass
class Acceptance:
    """One window's acceptance, on the device of the sampled ids.

    draft_mask:   [Dtot] bool, prefix-closed per request (request-major like draft_token_ids).
    accepted_len: [R] int32, accepted drafts per request, in [0, num_draft_tokens[r]].
    commit_mask:  [T] bool over the window's tokens, or None when no token map was given.
    """

    draft_mask: torch.Tensor
    accepted_len: torch.Tensor
    commit_mask: torch.Tensor | None = None

    @property
    def num_reqs(self) -> int:
        return self.accepted_len.shape[0]

    @property
    def num_drafts(self) -> int:
        """Dtot, from the shape (no sync)."""
        return self.draft_mask.shape[0]

    @property
    def num_accepted(self) -> torch.Tensor:
        """Total accepted drafts as a 0-d device tensor (no sync until you call int() on it)."""
        return self.accepted_len.sum()

    def accepted_per_request(self) -> list[int]:
        """Accepted length of each request as host ints (one sync on CUDA)."""
        return [int(a) for a in self.accepted_len.tolist()]

    @classmethod
    def from_draft_mask(cls, window: Window, draft_mask: torch.Tensor) -> "Acceptance":
        """From a prefix-closed draft mask `[Dtot]` bool: accepted lengths and the commit mask
        follow from the window's token map (no host sync)."""
        check_tensor("draft_mask", draft_mask, shape=(window.num_drafts,), dtypes=(torch.bool,),
                     what="[num_drafts] bool, one per draft token")
        accepted_len = window.accepted_len_from(draft_mask)
        return cls(draft_mask, accepted_len, window.commit_mask_for(draft_mask, accepted_len))

    @classmethod
    def from_accepted_len(cls, window: Window, accepted_len) -> "Acceptance":
        """From accepted lengths `[R]` (ints or a tensor): drafts 1..a_r of request r accepted."""
        acc = torch.as_tensor(accepted_len, device=window.token_req.device)
        if acc.numel() == 0:            # [] has no dtype to check (torch makes it float32)
            acc = acc.to(torch.int32)
        check_whole("accepted_len", acc)
        check_tensor("accepted_len", acc, shape=(window.num_reqs,), dtypes=INDEX_DTYPES, what="[num_reqs]")
        acc = acc.to(torch.int32)
        draft_pos = window.token_draft_pos[window.draft_rows]
        draft_mask = draft_pos <= acc[window.draft_req.long()]
        return cls(draft_mask, acc, window.commit_mask_from(acc))

    @classmethod
    def rejecting_all(cls, window: Window) -> "Acceptance":
        """Every draft rejected, every non-draft token kept (e.g. an EAGLE draft chain): laid out
        directly (per step on the host for the head's chain), the same as `from_accepted_len` of zeros."""
        dev = window.token_req.device
        acc = torch.zeros(window.num_reqs, dtype=torch.int32, device=dev)
        return cls(torch.zeros(window.num_drafts, dtype=torch.bool, device=dev), acc, window.commit_mask_from(acc))

    def to(self, device) -> "Acceptance":
        cm = None if self.commit_mask is None else self.commit_mask.to(device)
        return Acceptance(self.draft_mask.to(device), self.accepted_len.to(device), cm)
