"""K/V that leaves the device (chapter 15, section 4): the prefix cache's host tier and the
prefill-to-decode hand-off, each strategy run on one workload and measured.

- `offload_runs(pair, texts, ...)`: every text twice through a device cache too small to keep them
  (one request at a time), so each second visit finds its blocks in host memory; per offload strategy
  (engine.offload.OFFLOADS) the host hits, the bytes moved, the acceptance length of the second visits
  against the same requests without prefix caching, and whether the tokens are target-only's.
- `handoff_runs(pair, texts, ...)`: the texts prefilled by one engine and decoded by another, in this
  process (nwor_lab.disagg.handoff), per write policy and hand-off strategy: K/V bytes shipped, junk
  rows (past the committed length), rows holding a rejected draft, the decode engine's acceptance
  against one engine's, and whether its tokens are one engine's.

Rows carry `label`, `note`, `acceptance_after_hit` and `acceptance_same_without_cache`, so
`viz.prefix.acceptance_figure` draws both; `bytes_figure` draws the bytes shipped. Everything is
read from the engines' counters, traces and shipments; nothing here decides what a strategy does.
"""
from __future__ import annotations

import plotly.graph_objects as go

from nwor_lab.viz.prefix import _acceptance_length, acceptance_by_request
from nwor_lab.viz.theme import base_layout


def _serve(pair, prompts, *, k, block_size, num_blocks, new_tokens, nwor_mode, prefix=None):
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    target, head, _ = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=nwor_mode, scv_mode="graph"), k=k,
                   block_size=block_size, num_blocks=num_blocks, max_num_seqs=1, prefix_cache=prefix)
    reqs = [e.add_request(p, new_tokens) for p in prompts]
    e.run()
    return e, reqs


def offload_runs(pair, texts, *, offloads=("target_head", "target_only"), k: int = 4, block_size: int = 8,
                 new_tokens: int = 24, nwor_mode: str = "stage", host_blocks: int = 64) -> list[dict]:
    """-> one row per offload strategy (module docstring) plus the baseline (EAGLE, no prefix cache)."""
    from nwor_lab.engine.offload import OFFLOADS
    from nwor_lab.engine.prefix import PrefixCacheConfig
    tok = pair[2]
    first = [tok.encode(t).ids for t in texts]
    prompts = first + [list(p) for p in first]
    # room for one request's worst case, not for the others' cached blocks: they are evicted to the host
    num_blocks = -(-(max(len(p) for p in prompts) + new_tokens + k + 1) // block_size) + 2
    kw = dict(k=k, block_size=block_size, new_tokens=new_tokens, nwor_mode=nwor_mode)
    reference = [r.output for r in _serve(pair, prompts, **{**kw, "k": 0}, num_blocks=num_blocks)[1]]
    plain, plain_reqs = _serve(pair, prompts, **kw, num_blocks=num_blocks)
    base = acceptance_by_request(plain, [r.req_id for r in plain_reqs])
    second = range(len(first), len(prompts))
    rows = [dict(label="EAGLE, no prefix cache", note="the baseline: nothing kept between visits",
                 tokens_exact=[r.output for r in plain_reqs] == reference,
                 acceptance_after_hit=_acceptance_length([base[plain_reqs[i].req_id] for i in second]),
                 acceptance_same_without_cache=_acceptance_length([base[plain_reqs[i].req_id] for i in second]))]
    for name in offloads:
        e, reqs = _serve(pair, prompts, **kw, num_blocks=num_blocks,
                         prefix=PrefixCacheConfig(host_blocks=host_blocks, offload=name))
        s = e.prefix_stats()
        mine = acceptance_by_request(e, [r.req_id for r in reqs])
        cls = OFFLOADS[name]
        rows.append(dict(label=f"host tier: {name}", offload=name,
                         note=("the head's K/V and boundary row go with the block" if cls.keeps_head else
                               "the head's K/V left on the device and lost (vLLM #49071, SGLang #31600)"),
                         tokens_exact=[r.output for r in reqs] == reference,
                         host_hit_tokens=s["host_hit_tokens"], hit_tokens=s["hit_tokens"],
                         host_bytes_offloaded=s["host_bytes_offloaded"], host_bytes_restored=s["host_bytes_restored"],
                         slot_bytes=e.prefix.host.pool.slot_bytes, host_offloads=s["host_offloads"],
                         acceptance_after_hit=_acceptance_length([mine[reqs[i].req_id] for i in second]),
                         acceptance_same_without_cache=rows[0]["acceptance_after_hit"]))
    return rows


def handoff_runs(pair, texts, *, strategies=("nwor", "write_all", "no_head"), modes=("off", "stage"), k: int = 4,
                 block_size: int = 8, new_tokens: int = 24) -> list[dict]:
    """-> one row per (write policy, strategy): label, note, kv_bytes, frame_bytes, junk_rows,
    rejected_rows_shipped, acceptance_after_hit (the decode engine's), acceptance_same_without_cache
    (one engine's), tokens_exact (one engine's tokens)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.disagg import handoff, handoff_strategy
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.generate import acceptance_stats
    target, head, tok = pair
    prompts = [tok.encode(t).ids for t in texts]
    need = sum(-(-(len(p) + new_tokens + k + 1) // block_size) for p in prompts) + 1
    rows = []
    for mode in modes:
        def make():
            return SpecEngine(target, head, LabConfig(nwor_mode=mode, scv_mode="graph"), k=k, block_size=block_size,
                              num_blocks=need, max_num_seqs=len(prompts))
        one = make()
        reqs = [one.add_request(p, new_tokens) for p in prompts]
        one.run()
        ref, ref_acc = [r.output for r in reqs], acceptance_stats(one.trace, one.k)[0]
        for name in strategies:
            res = handoff(make(), make(), prompts, new_tokens, name)
            rows.append(dict(label=f"{mode} · {name}", mode=mode, strategy=name, note=handoff_strategy(name).summary,
                             kv_bytes=sum(res.kv_bytes), frame_bytes=sum(res.frame_bytes), junk_rows=sum(res.junk_rows),
                             rejected_rows_shipped=sum(len(x) for x in res.rejected_rows_shipped),
                             acceptance_after_hit=res.mean_acceptance_length, acceptance_same_without_cache=ref_acc,
                             tokens_exact=res.token_ids == ref))
    return rows


def bytes_figure(rows, *, title="K/V bytes shipped per hand-off strategy", subtitle=None) -> go.Figure:
    """Bars: K/V (and state) bytes shipped per row; the label adds the junk rows and the rejected ones."""
    x = [r["label"] for r in rows]
    colours = {"nwor": "#4c9a5b", "write_all": "#d0793a", "no_head": "#c0392b"}
    fig = go.Figure(go.Bar(x=x, y=[r["kv_bytes"] for r in rows],
                           marker_color=[colours.get(r["strategy"], "#5b8fd0") for r in rows],
                           text=[f"{r['kv_bytes'] / 1024:.0f} KiB<br>{r['junk_rows']} junk rows"
                                 + (f"<br>{r['rejected_rows_shipped']} rejected" if r["rejected_rows_shipped"] else "")
                                 for r in rows],
                           textposition="outside", cliponaxis=False, hovertext=[r["note"] for r in rows],
                           hoverinfo="text+y", showlegend=False))
    fig.update_layout(**base_layout(title, subtitle), height=440, yaxis_title="bytes (K/V rows and state)")
    fig.update_yaxes(rangemode="tozero", range=[0, max(r["kv_bytes"] for r in rows) * 1.3])
    return fig
