"""SCV in a CUDA graph: capture `torch.ops.nwor_lab.scv_mask` once per shape, then replay it.

    draft_token_ids  [Dtot]   int32/int64      cu_num_draft_tokens [R] (inclusive cumsum)
    sampled_token_ids [R, C]  -1 placeholders  token_req / token_draft_pos [T] (optional, both)
    -> Acceptance(draft_mask [Dtot] bool, accepted_len [R] int32, commit_mask [T] bool | None)

A graph replays kernels on fixed addresses, so each captured shape owns persistent ("static")
input and output buffers. A call copies its inputs into the static inputs (skipped for an input
that already IS the static buffer: engines can write there directly, see `static_inputs`),
replays, and returns the outputs (copied by default; `copy_outputs=False` returns the static
output buffers themselves, valid until the next call with the same shapes).

Graphs are keyed by (device, shapes, dtypes, whether a token map is given); a new key captures a
new graph (least recently used ones beyond `max_graphs` are dropped). Any failure to capture
raises `ScvGraphCaptureError`; `ScvRunner('adaptive')` catches it and falls back to eager.
For tests, `force_capture_failure=True` or env `NWOR_LAB_SCV_GRAPH_FAIL=1` makes every capture fail.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from nwor_lab.config import env_bool
from nwor_lab.ops.graphs import capture_graph
from nwor_lab.window import Acceptance

FORCE_FAIL_ENV = "NWOR_LAB_SCV_GRAPH_FAIL"


class ScvGraphCaptureError(RuntimeError):
    """The SCV op could not be captured in (or replayed from) a CUDA graph."""


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]   # draft, cu, sampled, token_req, token_draft_pos (static)
    outputs: tuple[torch.Tensor, ...]  # draft_mask, accepted_len, commit_mask (static)
    has_tokens: bool


def _key(args, has_tokens: bool):
    return (args[2].device, has_tokens) + tuple((tuple(a.shape), a.dtype) for a in args)


class GraphedScv:
    """Callable like `compute_acceptance(..., mode='graph')` on CUDA tensors; see module doc."""

    def __init__(self, *, copy_outputs: bool = True, max_graphs: int = 16,
                 force_capture_failure: bool | None = None):
        self.copy_outputs = copy_outputs
        self.max_graphs = max_graphs
        self.force_capture_failure = force_capture_failure
        self.num_captures = 0
        self.num_replays = 0
        self._graphs: OrderedDict = OrderedDict()

    def _forced(self) -> bool:
        if self.force_capture_failure is not None:
            return self.force_capture_failure
        return env_bool(FORCE_FAIL_ENV)

    @staticmethod
    def _normalise(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos):
        if (token_req is None) != (token_draft_pos is None):
            raise ValueError("token_req and token_draft_pos: pass both (for a commit mask) or neither")
        if not sampled_token_ids.is_cuda:
            raise ScvGraphCaptureError(f"CUDA graphs need CUDA tensors; sampled_token_ids is on "
                                       f"{sampled_token_ids.device}")
        has_tokens = token_req is not None
        if not has_tokens:
            empty = torch.empty(0, dtype=torch.int32, device=sampled_token_ids.device)
            token_req, token_draft_pos = empty, empty
        return (draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos), has_tokens

    def static_inputs(self, draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req=None,
                      token_draft_pos=None) -> tuple[torch.Tensor, ...]:
        """The static input buffers for these shapes (captured now if needed). Writing new ids into
        them and passing them back skips the input copies of `__call__`."""
        args, has_tokens = self._normalise(draft_token_ids, cu_num_draft_tokens, sampled_token_ids,
                                           token_req, token_draft_pos)
        return self._entry(args, has_tokens).inputs

    def _entry(self, args, has_tokens: bool) -> _Captured:
        key = _key(args, has_tokens)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(args, has_tokens)
            self._graphs[key] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return entry

    def _capture(self, args, has_tokens: bool) -> _Captured:
        if self._forced():
            raise ScvGraphCaptureError(f"CUDA graph capture of scv_mask was forced to fail "
                                       f"(force_capture_failure=True or {FORCE_FAIL_ENV}=1)")
        try:
            from nwor_lab.ops import _ext

            _ext.load()
            op = torch.ops.nwor_lab.scv_mask
            device = args[2].device
            with torch.cuda.device(device):
                inputs = tuple(a.detach().clone(memory_format=torch.contiguous_format) for a in args)
                outputs = (torch.zeros(args[0].shape[0], dtype=torch.bool, device=device),
                           torch.zeros(args[2].shape[0], dtype=torch.int32, device=device),
                           torch.zeros(args[3].shape[0], dtype=torch.bool, device=device))
                graph = capture_graph(lambda: op(*inputs, *outputs), device=device)
        except ScvGraphCaptureError:
            raise
        except Exception as err:  # noqa: BLE001 - every capture problem becomes one error type
            raise ScvGraphCaptureError(f"capturing scv_mask in a CUDA graph failed: "
                                       f"{type(err).__name__}: {err}") from err
        self.num_captures += 1
        return _Captured(graph, inputs, outputs, has_tokens)

    def __call__(self, draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req=None,
                 token_draft_pos=None):
        """Acceptance of one window, by graph replay (capturing first for a new shape)."""
        args, has_tokens = self._normalise(draft_token_ids, cu_num_draft_tokens, sampled_token_ids,
                                           token_req, token_draft_pos)
        entry = self._entry(args, has_tokens)
        for static, new in zip(entry.inputs, args):
            if static.data_ptr() != new.data_ptr() or static.stride() != new.stride():
                static.copy_(new, non_blocking=True)
        entry.graph.replay()
        self.num_replays += 1
        draft_mask, accepted_len, commit_mask = entry.outputs
        if self.copy_outputs:
            draft_mask, accepted_len = draft_mask.clone(), accepted_len.clone()
            commit_mask = commit_mask.clone() if has_tokens else None
        elif not has_tokens:
            commit_mask = None
        return Acceptance(draft_mask, accepted_len, commit_mask)
