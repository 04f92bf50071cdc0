"""The EAGLE draft chain d_1..d_k replayed from a CUDA graph: inside the verify step's graph
(`ChainBucket.place`: inputs from the device) or alone after an eager step (`GraphedDraft`:
inputs from the host), one draft-policy window on the head's layer, every row rejected."""
from __future__ import annotations

import torch

from nwor_lab.engine.graphed_static import GraphedBucket, bucket_size, max_blocks
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.kv import build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.window import Acceptance, Window


def chain_record_window(slots: list[list[int]]) -> Window:
    """CPU Window of a draft chain over len(slots) requests, request j's k - 1 rows at slots[j]
    (step-major rows, as `engine.drafter.chain_window`): what the chain's record counts."""
    n, m = len(slots), len(slots[0])
    flat = [slots[j][s] for s in range(m) for j in range(n)]
    return Window(torch.tensor(flat), torch.arange(n, dtype=torch.int32).repeat(m),
                  torch.arange(1, m + 1, dtype=torch.int32).repeat_interleave(n),
                  torch.arange(n * m).view(m, n).t().reshape(-1), [m] * n, [m] * n)


class ChainBucket(GraphedBucket):
    """Static buffers and graph of the EAGLE draft chain d_1..d_k for one padded batch size: the
    first draft from the verify step's head features, then k - 1 head passes, one row per request
    each (step-major rows, as `engine.drafter.chain_window`), in one draft-policy window on the
    head's layer, committed with every row rejected. Its inputs come from the host (`fill`) or,
    inside the verify graph, from the device (`place`)."""

    def __init__(self, engine, size: int, tables: torch.Tensor | None = None):
        e, dev, k = engine, engine.device, engine.k
        pol = e.drafter.policy
        self.size, rows = size, size * (k - 1)
        self.tables = tables if tables is not None else \
            torch.zeros(size, max_blocks(e), dtype=torch.int32, device=dev)
        self.features = torch.zeros(size, e.head.config.hidden_size, dtype=e.dtype, device=dev)
        slots = torch.full((rows,), -1, dtype=torch.long, device=dev)
        token_req = torch.arange(size, dtype=torch.int32, device=dev).repeat(k - 1)
        draft_pos = torch.arange(1, k, dtype=torch.int32, device=dev).repeat_interleave(size)
        order = torch.arange(rows, device=dev).view(k - 1, size).t().reshape(-1)   # request-major
        self.window = Window(slots, token_req, draft_pos, order, [k - 1] * size, [k - 1] * size)
        self.reject = Acceptance.rejecting_all(self.window)
        in_buffer = pol.window_in_buffer
        self.lens_offset = torch.zeros(k - 1, 1, dtype=torch.long, device=dev) if in_buffer else \
            torch.arange(1, k, device=dev)[:, None]                 # chain step s reads s own rows
        self.step_offset = torch.arange(k - 1, device=dev)[:, None]
        self.positions = torch.zeros(k - 1, size, dtype=torch.long, device=dev)   # [step, request]
        self.lens = torch.zeros(k - 1, size, dtype=torch.int32, device=dev)
        qsl = list(range(size + 1))
        qsl_t = torch.arange(size + 1, dtype=torch.int32, device=dev)
        self.steps = []
        for s in range(1, k):
            win_rows = win_start = None
            if in_buffer:   # request r's chain rows so far: r, size + r, ..., (s - 1) * size + r
                win_rows = (torch.arange(s, device=dev)[None, :] * size + torch.arange(size, device=dev)[:, None]).reshape(-1)
                win_start = torch.arange(0, s * size + 1, s, dtype=torch.int32, device=dev)
            md = AttentionMetadata(self.positions[s - 1], slots[(s - 1) * size:s * size], qsl, None, None, None,
                                   e.cache, pol, (s - 1) * size,
                                   KernelArgs(self.tables, self.lens[s - 1], qsl_t, win_rows, win_start,
                                              max_query_len=1))
            self.steps.append(md)

    @staticmethod
    def row_slots(engine, r, base: int) -> list[int]:
        """Slots of request r's chain rows, at positions base .. base + k - 2 (base: its
        num_computed after the verify window)."""
        return r.block_table.slots(range(base, base + engine.k - 1))

    def fill(self, engine, requests, features) -> None:
        n = len(requests)
        tables = torch.zeros(self.tables.shape, dtype=torch.int32)
        for j, r in enumerate(requests):
            r.block_table.ensure(r.num_computed + 1, lookahead=engine.k)     # the next window's slots too
            tables[j, :len(r.block_table.blocks)] = torch.tensor(r.block_table.blocks, dtype=torch.int32)
        self.tables.copy_(tables)
        bases = [r.num_computed for r in requests]
        self.rows = [self.row_slots(engine, r, b) for r, b in zip(requests, bases)]
        flat = [-1] * (self.size * (engine.k - 1))
        for j, rows in enumerate(self.rows):
            flat[j::self.size] = rows                                # step-major
        self.window.slot_mapping.copy_(torch.tensor(flat))
        base = torch.tensor(bases + [0] * (self.size - n), device=engine.device)
        real = torch.arange(self.size, device=engine.device) < n
        self._set_rows(engine, base, real)
        self.features.zero_()
        self.features[:n].copy_(features)

    def place(self, engine, base: torch.Tensor, drafting: torch.Tensor, features: torch.Tensor) -> None:
        """The chain's inputs from the device: base [B] num_computed of each request (0 where it
        does not draft), drafting [B] bool (False: padding, or finished in this window),
        features [B, h] the head's output at each kept row."""
        self._set_rows(engine, base, drafting)
        self.features.copy_(torch.where(drafting[:, None], features, torch.zeros_like(features)))

    def _set_rows(self, engine, base, real) -> None:
        """Positions, cached lengths and slots of every chain row from base [B] (device ops)."""
        bs = engine.cache.spec.block_size
        pos = base[None, :] + self.step_offset                          # [k-1, B]
        self.positions.copy_(pos)
        self.lens.copy_(base[None, :] + self.lens_offset)
        rows = torch.where(real[None, :], pos, -1).reshape(-1)           # step-major, as the window
        self.window.slot_mapping.copy_(build_slot_mapping(self.tables, self.window.token_req, rows, bs))

    def body(self, engine):
        head, pol = engine.head, engine.drafter.policy
        g = self.features
        token = head.compute_logits(g).float().argmax(-1)
        drafts = [token]
        layer = head.layer_index
        pol.begin(self.window, layers=range(layer, layer + 1), kind="draft")
        for md in self.steps:
            g = head(drafts[-1], g, md)
            drafts.append(head.compute_logits(g).float().argmax(-1))
        pol.commit(self.reject)
        return torch.stack(drafts, 1)         # [B, k]


class GraphedDraft:
    """The drafter's graphed path for chains not carried by a verify graph (after an eager step,
    e.g. the prefill's first drafts): every request drafts k >= 2, greedily."""

    def __init__(self, engine, max_size: int):
        self.engine = engine
        self.buckets: dict[int, ChainBucket] = {}
        self.max_size = max_size
        self.steps = 0
        engine.drafter.policy.reserve(max_size * max(1, engine.k - 1))   # never reallocated (see above)

    def eligible(self, requests) -> bool:
        e = self.engine
        return (e.k >= 2 and e.temperature == 0 and not e.observers and not e.config.debug
                and len(requests) <= self.max_size)

    def draft(self, requests, features, step_index: int, capture: bool):
        e = self.engine
        size = bucket_size(len(requests))
        if size not in self.buckets:
            self.buckets[size] = ChainBucket(e, size)
        b = self.buckets[size]
        b.fill(e, requests, features)
        pol = e.drafter.policy
        records = pol.records
        pol.records = False
        try:
            drafts = b.run(e, capture, [pol])
        finally:
            pol.records = records
        self.steps += 1
        ran = list(zip(requests, drafts[:len(requests)].tolist(), b.rows))
        return self.finish(b, ran, step_index)

    def finish(self, b: ChainBucket, ran, step_index: int):
        """`ran`: (request, its drafts d_1..d_k, its chain rows' slots) for every request the
        chain ran for. Hand the drafts to those still running; record the chain window, counted
        on a CPU window of those requests (not the bucket's padding) -> (WindowTrace, Window),
        or None when it ran for none."""
        pol = self.engine.drafter.policy
        if not ran:
            return None
        layer = self.engine.head.layer_index
        window = chain_record_window([slots for _, _, slots in ran])
        record = pol.replayed(window, Acceptance.rejecting_all(window), range(layer, layer + 1))
        for r, drafts, _ in ran:
            if not r.finished:       # (one that emitted the end token in a chained step)
                r.drafts, r.draft_probs = list(drafts), None
        n, k = len(ran), self.engine.k
        return WindowTrace(step_index, "draft", [r.req_id for r, _, _ in ran], ["draft"] * n, [k - 1] * n,
                           [0] * n, [[] for _ in ran], record), b.window
