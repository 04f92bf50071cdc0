"""SpecDecodeMetadata: which logits rows verify which drafts, in vLLM v1's layout.

A verify window schedules, for request `r` with `n_r` drafts, the tokens `[t_last, d_1 .. d_n_r]`
as its LAST `n_r + 1` scheduled tokens (a request may schedule more: chunked prefill before them).
The target model computes logits only at those `n_r + 1` positions per request; the flattened list
of positions is `logits_indices`. Inside that list, per request, the first `n_r` rows are the
target rows that verify `d_1 .. d_n_r` (`target_logits_indices`) and the last row predicts the
bonus token sampled when every draft is accepted (`bonus_logits_indices`).

vLLM's own example (any builder must reproduce it):
    num_draft_tokens        = [3, 0, 2, 0, 1]
    cu_num_scheduled_tokens = [4, 104, 107, 207, 209]
    logits_indices          = [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    target_logits_indices   = [0, 1, 2, 5, 6, 9]
    bonus_logits_indices    = [3, 4, 7, 8, 10]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from nwor_lab._checks import INDEX_DTYPES, check_tensor
from nwor_lab.window import DraftCounts


def _as_int_list(name: str, values) -> list[int]:
    """Host list of ints from a list, tuple, numpy array or 1-D tensor (one sync for CUDA)."""
    if isinstance(values, torch.Tensor):
        check_tensor(name, values, ndim=1, dtypes=INDEX_DTYPES, what="[num_reqs]")
        return [int(v) for v in values.tolist()]
    try:
        out = [int(v) for v in values]
    except TypeError as exc:
        raise TypeError(f"{name}: expected a sequence of ints (one per request), "
                        f"got {type(values).__name__}") from exc
    return out


@dataclass
class SpecDecodeMetadata(DraftCounts):
    """Draft ids and logits indices of one verify window (vLLM v1 fields, same meaning).

    draft_token_ids:       [Dtot] int32, drafts of all requests, request-major.
    num_draft_tokens:      list[int] of length R, drafts per request (0 = no speculation).
    cu_num_draft_tokens:   [R] int32, inclusive cumulative sum of `num_draft_tokens`.
    target_logits_indices: [Dtot] int32, row of `logits` (the `logits_indices` rows) that verifies
                           each draft.
    bonus_logits_indices:  [R] int32, row of `logits` that samples each request's bonus token.
    logits_indices:        [Dtot + R] int32, positions in the flattened window whose hidden states
                           go through the LM head (per request: its last n_r + 1 tokens).
    """

    draft_token_ids: torch.Tensor
    num_draft_tokens: list[int]
    cu_num_draft_tokens: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: torch.Tensor

    @property
    def cu_num_sampled_tokens(self) -> torch.Tensor:
        """[R] int32, inclusive cumsum of `n_r + 1` (newer vLLM stores this as a field)."""
        ones = torch.arange(1, self.num_reqs + 1, dtype=torch.int32, device=self.cu_num_draft_tokens.device)
        return self.cu_num_draft_tokens + ones

    def to(self, device) -> "SpecDecodeMetadata":
        """The same metadata with every tensor on `device`."""
        return SpecDecodeMetadata(
            draft_token_ids=self.draft_token_ids.to(device),
            num_draft_tokens=list(self.num_draft_tokens),
            cu_num_draft_tokens=self.cu_num_draft_tokens.to(device),
            target_logits_indices=self.target_logits_indices.to(device),
            bonus_logits_indices=self.bonus_logits_indices.to(device),
            logits_indices=self.logits_indices.to(device),
        )

    @classmethod
    def build(cls, num_draft_tokens: Sequence[int], cu_num_scheduled_tokens: Sequence[int],
              draft_token_ids=None, device="cpu", *, input_ids: torch.Tensor | None = None
              ) -> "SpecDecodeMetadata":
        """Build the indices the way vLLM's model runner does for a verify window.

        num_draft_tokens:        R ints >= 0 (list, numpy array or 1-D int tensor).
        cu_num_scheduled_tokens: R ints, inclusive cumsum of scheduled tokens per request
                                 (vLLM's `query_start_loc[1:]`); request r schedules
                                 `cu[r] - cu[r-1]` tokens, at least `n_r + 1` of them.
        draft_token_ids:         [Dtot] ints (tensor or list), request-major. When None they are
                                 read from `input_ids` ([T], the window's token ids) at the draft
                                 positions, as vLLM does; without either they are zeros, for
                                 callers that only need the indices.
        device:                  where the returned tensors live (indices are built on the host).
        """
        n = _as_int_list("num_draft_tokens", num_draft_tokens)
        cu = _as_int_list("cu_num_scheduled_tokens", cu_num_scheduled_tokens)
        if len(n) != len(cu):
            raise ValueError(f"num_draft_tokens has {len(n)} requests but cu_num_scheduled_tokens has "
                             f"{len(cu)}; pass one entry per request in both")
        bad = [r for r, k in enumerate(n) if k < 0]
        if bad:
            raise ValueError(f"num_draft_tokens: requests {bad[:4]} have a negative draft count "
                             f"{[n[r] for r in bad[:4]]}; use 0 for a request without drafts")
        prev = 0
        for r, (k, end) in enumerate(zip(n, cu)):
            if end < prev:
                raise ValueError(f"cu_num_scheduled_tokens must be non-decreasing (an inclusive cumsum); "
                                 f"entry {r} is {end} after {prev}")
            if end - prev < k + 1:
                raise ValueError(f"request {r} schedules {end - prev} tokens (cu_num_scheduled_tokens) but "
                                 f"has {k} drafts; it must schedule at least num_draft_tokens[r] + 1 = "
                                 f"{k + 1} (t_last and its drafts)")
            prev = end

        # Host construction, vectorised over tokens: vLLM builds these on the CPU too.
        num_reqs = len(n)
        n_t = torch.tensor(n, dtype=torch.int64)
        cu_sched = torch.tensor(cu, dtype=torch.int64)
        num_sampled = n_t + 1                                   # t_last's logits row + one per draft
        cu_sampled = torch.cumsum(num_sampled, 0)
        total_sampled = int(cu_sampled[-1]) if num_reqs else 0
        req_of_row = torch.repeat_interleave(torch.arange(num_reqs), num_sampled, output_size=total_sampled)
        first_row = cu_sampled - num_sampled                    # first logits row of each request
        row_offset = torch.arange(total_sampled) - first_row[req_of_row]
        # A request's sampled positions are its last n_r + 1 scheduled tokens.
        logits_indices = (cu_sched - num_sampled)[req_of_row] + row_offset

        cu_draft = torch.cumsum(n_t, 0)
        total_drafts = int(cu_draft[-1]) if num_reqs else 0
        req_of_draft = torch.repeat_interleave(torch.arange(num_reqs), n_t, output_size=total_drafts)
        draft_offset = torch.arange(total_drafts) - (cu_draft - n_t)[req_of_draft]
        target_logits_indices = first_row[req_of_draft] + draft_offset
        bonus_logits_indices = cu_sampled - 1

        if draft_token_ids is None and input_ids is not None:
            check_tensor("input_ids", input_ids, ndim=1, dtypes=INDEX_DTYPES, what="[num_tokens] window token ids")
            if num_reqs and input_ids.shape[0] < cu[-1]:
                raise ValueError(f"input_ids: has {input_ids.shape[0]} tokens but the window schedules "
                                 f"{cu[-1]} (cu_num_scheduled_tokens[-1])")
            # Draft d_j sits one position after the row that verifies it.
            draft_pos = logits_indices[target_logits_indices + 1].to(input_ids.device)
            draft_token_ids = input_ids[draft_pos]
        if draft_token_ids is None:
            draft_token_ids = torch.zeros(total_drafts, dtype=torch.int32)
        elif not isinstance(draft_token_ids, torch.Tensor):
            draft_token_ids = torch.tensor(_as_int_list("draft_token_ids", draft_token_ids), dtype=torch.int32)
        check_tensor("draft_token_ids", draft_token_ids, shape=(total_drafts,), dtypes=INDEX_DTYPES,
                     what=f"[sum(num_draft_tokens)] = [{total_drafts}] draft ids, request-major")

        def i32(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=torch.int32)

        return cls(
            draft_token_ids=i32(draft_token_ids),
            num_draft_tokens=n,
            cu_num_draft_tokens=i32(cu_draft),
            target_logits_indices=i32(target_logits_indices),
            bonus_logits_indices=i32(bonus_logits_indices),
            logits_indices=i32(logits_indices),
        )

    @classmethod
    def make_dummy(cls, draft_token_ids: Sequence[Sequence[int]], device="cpu") -> "SpecDecodeMetadata":
        """Metadata for a pure verify window: request r schedules exactly `[t_last, *drafts[r]]`."""
        n = [len(d) for d in draft_token_ids]
        cu, total = [], 0
        for k in n:
            total += k + 1
            cu.append(total)
        flat = [int(t) for d in draft_token_ids for t in d]
        return cls.build(n, cu, torch.tensor(flat, dtype=torch.int32), device=device)
