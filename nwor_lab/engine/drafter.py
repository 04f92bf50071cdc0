"""EAGLE drafting after a verify window: the first draft, then the chain d_2..d_n in one window.

The chain's K/V (head layer only) comes from *predicted* features, so none of it is ever kept:
its window marks every row as a draft and is committed with nothing accepted. `off` leaves the
rows in the cache, as vLLM does (the next verify window's head pass overwrites them), `cow`
restores them, `stage` never writes them. Rows are step-major: step s (1-based) holds one row
per request still drafting, at position `num_computed + s - 1`, input `(d_s, g_{s-1})`; its
output `g_s` proposes `d_{s+1}`.
"""
from __future__ import annotations

import torch

from nwor_lab.engine.trace import WindowTrace
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.policies import Window


def propose(head, g: torch.Tensor, temperature: float, generator):
    """Head outputs `[n, h]` -> (draft ids `[n]`, draft probs `[n, V]` or None when greedy)."""
    logits = head.compute_logits(g).float()
    if temperature == 0:
        return logits.argmax(-1), None
    q = torch.softmax(logits / temperature, -1)
    race = torch.empty_like(q).exponential_(generator=generator)   # exponential race = sample from q
    return (q / race).argmax(-1), q


def chain_window(reqs, n_drafts: list[int], device) -> tuple[Window, list[list[int]]]:
    """The chain window of requests drafting `n_drafts[j] >= 2` tokens -> (window, rows per request)."""
    steps = max(n_drafts) - 1
    rows_of = [[] for _ in reqs]
    token_req, draft_pos, slots = [], [], []
    for s in range(1, steps + 1):
        for j, r in enumerate(reqs):
            if n_drafts[j] > s:
                rows_of[j].append(len(token_req))
                token_req.append(j), draft_pos.append(s)
                slots += r.block_table.slots([r.num_computed + s - 1])
    counts = [n - 1 for n in n_drafts]
    draft_rows = [row for rows in rows_of for row in rows]         # request-major, as Window wants
    window = Window(torch.tensor(slots, dtype=torch.long, device=device),
                    torch.tensor(token_req, dtype=torch.int32, device=device),
                    torch.tensor(draft_pos, dtype=torch.int32, device=device),
                    torch.tensor(draft_rows, dtype=torch.long, device=device), counts, counts)
    return window, rows_of


def draft(engine, reqs, g: torch.Tensor) -> None:
    """Give every request in `reqs` its drafts for the next window. g `[len(reqs), h]`: the head
    output at each request's last committed row (from the verify window's head pass)."""
    head, dev = engine.head, engine.device
    n_d = [min(engine.k, r.remaining - 1) for r in reqs]
    d, q = propose(head, g, engine.temperature, engine.generator)
    for j, r in enumerate(reqs):
        if n_d[j] > 0:
            r.drafts = [int(d[j])]
            r.draft_probs = None if q is None else q[j:j + 1]
            r.block_table.ensure(r.num_computed + 1, lookahead=n_d[j])   # slots of the next window
    chain = [j for j in range(len(reqs)) if n_d[j] > 1]
    if not chain:
        return
    creqs, cn, g = [reqs[j] for j in chain], [n_d[j] for j in chain], g[chain]
    window, rows_of = chain_window(creqs, cn, dev)
    policy = engine.draft_policy
    engine._notify_begin("draft", window)
    policy.begin(window, layers=range(head.layer_index, head.layer_index + 1))  # the chain writes the head only
    try:
        offset = 0
        for s in range(1, max(cn)):
            live = [j for j in range(len(creqs)) if cn[j] > s]
            rs = [creqs[j] for j in live]
            # stage: committed prefix from the cache, chain rows so far from the staging buffer
            md = AttentionMetadata.build(
                engine.cache, [r.num_computed + s - 1 for r in rs], [1] * len(rs), [r.block_table.blocks for r in rs],
                [r.num_computed if engine.stage else r.num_computed + s for r in rs],
                slot_mapping=window.slot_mapping[offset:offset + len(rs)],
                window_rows=[rows_of[j][:s] for j in live] if engine.stage else None,
                policy=policy, write_offset=offset)
            ids = torch.tensor([r.drafts[-1] for r in rs], dtype=torch.long, device=dev)
            out = head(ids, g[live], md)
            d, q = propose(head, out, engine.temperature, engine.generator)
            g = g.clone()
            g[live] = out
            for i, r in enumerate(rs):
                r.drafts.append(int(d[i]))
                if q is not None:
                    r.draft_probs = torch.cat([r.draft_probs, q[i:i + 1]])
            offset += len(rs)
        record = policy.commit(torch.zeros(window.num_drafts, dtype=torch.bool, device=dev))
    except BaseException:
        if policy.window is not None:
            policy.cancel()
        raise
    entry = WindowTrace(engine.step_index, "draft", [r.req_id for r in creqs], ["draft"] * len(creqs),
                        [n - 1 for n in cn], [0] * len(creqs), [[] for _ in creqs], record)
    engine.trace.append(entry)
    engine._notify_end(entry, window)
