"""Prefix caching seen from the outside (chapter 15): the life of the cache's blocks across requests,
and the field's strategies run side by side on one workload.

- `block_life(pair, texts, ...)`: requests served one after another with prefix caching on; after
  each request's first step and its last, every cache block's state (free, held by its computing
  request, shared by a hit, partial, idle but cached). `block_life_figure` draws them as rows.
- `strategy_runs(pair, texts, ...)`: the same requests through the engine per strategy (target-only,
  EAGLE without prefix caching, and EAGLE with each head-cache / lookahead strategy of
  `engine.prefix`): hit rate, tokens recomputed, acceptance length after a hit, and whether the
  tokens equal target-only decoding. `hit_rate_figure` and `acceptance_figure` draw them.

Everything is measured from the engine's own counters and trace (`engine.prefix_stats()`,
`engine.prefix.hits`, `engine.trace`); nothing here decides what a strategy does.
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from nwor_lab.viz.categories import add_category_legend, category_heatmap
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import CELL_FONT, STATE_COLOURS, base_layout

# -- the workload --------------------------------------------------------------------------------
SYSTEM = ("# Utilities for reading configuration files.\nimport os\nimport sys\n\n\n"
          "def read_lines(path):\n    with open(path) as f:\n        return f.read().splitlines()\n\n\n")
# the conversations after it: the held-out prompts the shipped pair's tests decode (tests/test_engine_shipped.py)
PROMPTS = ("def parse_header(line):\n    \"\"\"Split a header line into its name and value.\"\"\"\n",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
           "import os\n\n\ndef walk_sizes(root):\n    total = 0\n"
           "    for dirpath, dirnames, filenames in os.walk(root):\n",
           "    if not isinstance(value, int):\n        raise TypeError(")


def conversations(prompts, returning: int = 1, system: str = SYSTEM) -> list[str]:
    """A shared system prompt before each prompt, then the first `returning` conversations again
    (a user who comes back): the requests, in arrival order."""
    if returning < 0 or returning > len(prompts):
        raise ValueError(f"returning={returning}: choose 0 .. {len(prompts)} (the prompts that come back)")
    texts = [system + p for p in prompts]
    return texts + texts[:returning]


# -- the strategies --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Strategy:
    """One run of the side-by-side: `drafting` (EAGLE on, else target-only) and the prefix cache's
    settings (`head_cache`, `lookahead`; None = prefix caching off)."""
    label: str
    drafting: bool
    head_cache: str | None = None
    lookahead: str | None = None
    note: str = ""

    def prefix_config(self):
        from nwor_lab.engine.prefix import PrefixCacheConfig
        if self.head_cache is None:
            return None
        return PrefixCacheConfig(head_cache=self.head_cache, lookahead=self.lookahead)


STRATEGIES = (
    Strategy("target-only", False, "cached", "boundary", "no draft head: the hit rate to match"),
    Strategy("EAGLE, no prefix cache", True, note="acceptance without hits: the baseline"),
    Strategy("EAGLE: boundary + cached", True, "cached", "boundary", "exact: the head's K/V rides with the block"),
    Strategy("EAGLE: drop_last + cached", True, "cached", "drop_last", "vLLM #53670: the last hit block recomputed"),
    Strategy("EAGLE: boundary + missing", True, "missing", "boundary", "SGLang #31600: the head's K/V of a hit lost"),
)


def _engine(pair, strategy: Strategy, *, k: int, block_size: int, num_blocks: int, nwor_mode: str):
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    target, head, _ = pair
    return SpecEngine(target, head if strategy.drafting else None, LabConfig(nwor_mode=nwor_mode, scv_mode="graph"),
                      k=k if strategy.drafting else 0, block_size=block_size, num_blocks=num_blocks, max_num_seqs=1,
                      prefix_cache=strategy.prefix_config())


def acceptance_by_request(engine, req_ids) -> dict[int, list[int]]:
    """Accepted drafts of every verify window that had drafts, per request."""
    out = {r: [] for r in req_ids}
    for w in engine.trace:
        if w.kind == "verify":
            for rid, n, a in zip(w.req_ids, w.drafted, w.accepted):
                if n and rid in out:
                    out[rid].append(int(a))
    return out


def _acceptance_length(windows: list[list[int]]) -> float:
    """Tokens emitted per verify window: its accepted drafts plus the target's own token."""
    flat = [a for w in windows for a in w]
    return 1.0 + sum(flat) / len(flat) if flat else float("nan")


def strategy_runs(pair, texts, *, strategies=STRATEGIES, k: int = 4, block_size: int = 8, new_tokens: int = 24,
                  nwor_mode: str = "stage", num_blocks: int = 256) -> list[dict]:
    """Each strategy serves `texts` one request after another (each finds the ones before it cached
    and idle). -> one row per strategy: label, note, hit_rate, hit_tokens, prompt_tokens,
    recomputed_tokens, hit_requests, acceptance_after_hit (tokens per verify window of the requests
    that hit, when drafting), acceptance_same_without_cache (the same requests, EAGLE without prefix
    caching), tokens_exact (every request's tokens equal target-only decoding without prefix caching)."""
    tok = pair[2]
    prompts = [tok.encode(t).ids for t in texts]
    kw = dict(k=k, block_size=block_size, num_blocks=num_blocks, nwor_mode=nwor_mode)

    def serve(strategy):
        e = _engine(pair, strategy, **kw)
        reqs = [e.add_request(p, new_tokens) for p in prompts]
        e.run()
        return e, reqs

    ref_engine, ref_reqs = serve(Strategy("reference", False))
    reference = [r.output for r in ref_reqs]
    runs = {s.label: serve(s) for s in strategies}
    plain = next((runs[s.label] for s in strategies if s.drafting and s.head_cache is None), None)
    rows = []
    for s in strategies:
        e, reqs = runs[s.label]
        row = dict(label=s.label, note=s.note, drafting=s.drafting, head_cache=s.head_cache, lookahead=s.lookahead,
                   tokens_exact=[r.output for r in reqs] == reference)
        stats = e.prefix_stats()
        if stats is not None:
            row.update({key: stats[key] for key in ("hit_rate", "hit_tokens", "prompt_tokens", "recomputed_tokens",
                                                    "hit_requests", "blocks_copied", "head_rows_recomputed")})
        if s.drafting and plain is not None:
            hit = [i for i, r in enumerate(reqs) if e.prefix is not None and e.prefix.hits.get(r.req_id, 0) > 0]
            if e.prefix is None:       # the baseline: the requests that hit in the exact run
                exact = next((runs[x.label] for x in strategies if x.drafting and x.head_cache == "cached"), None)
                hit = [i for i, r in enumerate(exact[1]) if exact[0].prefix.hits.get(r.req_id, 0) > 0] if exact else []
            mine = acceptance_by_request(e, [r.req_id for r in reqs])
            base = acceptance_by_request(plain[0], [r.req_id for r in plain[1]])
            row["acceptance_after_hit"] = _acceptance_length([mine[reqs[i].req_id] for i in hit])
            row["acceptance_same_without_cache"] = _acceptance_length([base[plain[1][i].req_id] for i in hit])
            row["hit_request_indices"] = hit
        rows.append(row)
    return rows


STRATEGY_COLOURS = {
    "target-only": "#999999",
    "EAGLE, no prefix cache": STATE_COLOURS[SlotState.WRITTEN],
    "EAGLE: boundary + cached": STATE_COLOURS[SlotState.COMMITTED],
    "EAGLE: drop_last + cached": STATE_COLOURS[SlotState.STAGED],
    "EAGLE: boundary + missing": STATE_COLOURS[SlotState.REJECTED],
}


def _bars(rows, key, fmt, title, subtitle, y_title, *, base_key=None, height=430, textposition="outside"):
    rows = [r for r in rows if r.get(key) is not None]
    x = [r["label"].replace("EAGLE: ", "EAGLE:<br>") for r in rows]
    y = [r[key] for r in rows]
    fig = go.Figure(go.Bar(x=x, y=y, marker_color=[STRATEGY_COLOURS.get(r["label"], "#5b8fd0") for r in rows],
                           text=[fmt(r) for r in rows], textposition=textposition, cliponaxis=False,
                           hovertext=[r["note"] for r in rows], hoverinfo="text+y", showlegend=False))
    if base_key:
        base = [r[base_key] for r in rows]
        fig.add_trace(go.Scatter(x=x, y=base, mode="markers", name="the same requests, EAGLE without prefix caching",
                                 marker=dict(symbol="line-ew-open", size=44, color="#222222", line=dict(width=3))))
    fig.update_layout(**base_layout(title, subtitle), height=height, yaxis_title=y_title)
    fig.update_yaxes(rangemode="tozero", showgrid=True, gridcolor="#eeeeee")
    return fig


def hit_rate_figure(rows, *, title="Prefix hit rate per strategy", subtitle=None) -> go.Figure:
    """Hit tokens over prompt tokens, per strategy that caches (the bar's label: hit / prompt tokens,
    tokens recomputed)."""
    def fmt(r):
        return (f"{100 * r['hit_rate']:.1f} %<br>{r['hit_tokens']}/{r['prompt_tokens']} tokens"
                + (f"<br>{r['recomputed_tokens']} recomputed" if r["recomputed_tokens"] else ""))
    fig = _bars([r for r in rows if "hit_rate" in r], "hit_rate", fmt, title, subtitle, "hit tokens / prompt tokens",
                height=470)
    fig.update_yaxes(tickformat=".0%", range=[0, max(r.get("hit_rate", 0) for r in rows) * 1.35 or 1])
    return fig


def acceptance_figure(rows, *, title="Acceptance length of the requests that hit", subtitle=None) -> go.Figure:
    """Tokens per verify window of the requests that hit, per drafting strategy, against the same
    requests without prefix caching (the black tick)."""
    drafting = [r for r in rows if r.get("acceptance_after_hit") is not None]
    fig = _bars(drafting, "acceptance_after_hit", lambda r: f"{r['acceptance_after_hit']:.2f}", title, subtitle,
                "tokens per verify window", base_key="acceptance_same_without_cache", textposition="inside")
    top = max(max(r["acceptance_after_hit"], r["acceptance_same_without_cache"]) for r in drafting)
    fig.update_yaxes(range=[0, top * 1.25])
    return fig


# -- the life of the blocks -------------------------------------------------------------------------
FREE, HELD, SHARED, PARTIAL, IDLE, PRIVATE = range(6)
BLOCK_STATES = [("free", STATE_COLOURS[SlotState.EMPTY]),
                ("held: committed by its request, registered", STATE_COLOURS[SlotState.COMMITTED]),
                ("held: shared from the cache (a hit)", STATE_COLOURS[SlotState.RESTORED]),
                ("held: the open block, or one reserved for the next window (never registered)",
                 STATE_COLOURS[SlotState.WRITTEN]),
                ("idle: nobody holds it, still cached (evictable)", STATE_COLOURS[SlotState.OLD]),
                ("held: full, not registered (a private copy)", STATE_COLOURS[SlotState.LOGGED])]


def block_states(engine, names: dict[int, str]) -> tuple[list[int], list[str]]:
    """Every cache block's state now (one of BLOCK_STATES) and who holds it (`names`: request id ->
    label). Reads the scheduler's running requests, the caching allocator and the per-request hits."""
    pc, bs = engine.prefix, engine.cache.spec.block_size
    al = pc.allocator
    nb = engine.cache.spec.num_blocks
    state, text = [FREE] * nb, [""] * nb
    for b in al.idle:
        state[b] = IDLE
    for r in engine.scheduler.running:
        hit_blocks = pc.hits.get(r.req_id, 0) // bs
        for i, b in enumerate(r.block_table.blocks):
            full = (i + 1) * bs <= r.num_computed
            state[b] = (SHARED if i < hit_blocks and b in al.hash_of else
                        HELD if full and b in al.hash_of else PRIVATE if full else PARTIAL)
            text[b] = (text[b] + "+" if text[b] else "") + names.get(r.req_id, str(r.req_id))
    return state, text


def block_life(pair, texts, *, labels=None, k: int = 4, block_size: int = 8, num_blocks: int = 32,
               new_tokens: int = 24, nwor_mode: str = "stage", head_cache: str = "cached",
               lookahead: str = "boundary") -> dict:
    """Serve `texts` one after another with prefix caching on; after each request's first step and
    its last, every block's state. -> dict(frames=[(caption, states, texts)], stats, outputs, hits)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.prefix import PrefixCacheConfig
    target, head, tok = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=nwor_mode, scv_mode="graph"), k=k,
                   block_size=block_size, num_blocks=num_blocks, max_num_seqs=1,
                   prefix_cache=PrefixCacheConfig(head_cache=head_cache, lookahead=lookahead))
    labels = labels or [chr(ord("A") + i) for i in range(len(texts))]
    reqs = [e.add_request(tok.encode(t).ids, new_tokens) for t in texts]
    names = {r.req_id: lab for r, lab in zip(reqs, labels)}
    frames, seen = [], set()
    while e.scheduler.has_work:
        running = [r for r in e.scheduler.running]
        e.step()
        now = [r for r in e.scheduler.running]
        for r in now:
            if r.req_id not in seen:
                seen.add(r.req_id)
                hit = e.prefix.hits.get(r.req_id, 0)
                frames.append((f"{names[r.req_id]} prefilled ({hit} of {len(r.prompt)} prompt tokens hit)",
                               *block_states(e, names)))
        for r in running:
            if r.finished and all(x is not r for x in now):
                frames.append((f"{names[r.req_id]} finished ({len(r.output)} tokens)", *block_states(e, names)))
    return dict(frames=frames, stats=e.prefix_stats(), outputs=[r.output for r in reqs],
                hits=[e.prefix.hits.get(r.req_id, 0) for r in reqs], prompt_lens=[len(r.prompt) for r in reqs],
                block_size=block_size)


def block_life_figure(life: dict, *, title="The cache's blocks as requests come and go", subtitle=None) -> go.Figure:
    """One row per moment, one cell per cache block (up to the last block ever used)."""
    frames = life["frames"]
    used = max((i for _, s, _ in frames for i, v in enumerate(s) if v != FREE), default=0) + 1
    z = [s[:used] for _, s, _ in frames]
    text = [t[:used] for _, _, t in frames]
    y = [c for c, _, _ in frames]
    fig = go.Figure(category_heatmap(z, BLOCK_STATES, x=[str(b) for b in range(used)], y=y, text=text,
                                     texttemplate="%{text}", textfont=CELL_FONT, xgap=2, ygap=2,
                                     hovertemplate="%{y}<br>block %{x}: %{text}<extra></extra>"))
    add_category_legend(fig, BLOCK_STATES)
    fig.update_layout(**base_layout(title, subtitle), height=200 + 34 * len(frames) + 60,
                      width=min(1100, 330 + 30 * used))
    fig.update_xaxes(title_text="cache block id (cell: the request that holds it)", type="category", showgrid=False)
    fig.update_yaxes(autorange="reversed", type="category", showgrid=False)
    return fig
