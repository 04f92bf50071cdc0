"""Speculative sampling at temperature > 0, step by step, and what it needs from the engine.

- `window_steps`: one request's verify window run through the lab's sampler
  (`speculative.rejection_sample`), with the quantities it decided on laid out per draft: p(x), q(x),
  their ratio, the uniform u it was compared with (replayed from the same seeded generator, in the
  sampler's order: bonus noise, then one u per draft), the verdict, and the distribution the emitted
  token came from. The replay is checked against the sampler's own output (an error if they part).
- `emitted_distribution`: the exact law of the first emitted token, by enumeration, when drafts are
  drawn from q_draw but the sampler is told q_told. With q_told = q_draw it is the target's p (the
  guarantee); a sampler handed the wrong draft probabilities (dropped, or recomputed from different
  K/V) emits another law.
- `steps_figure` / `law_figure`: the pictures.

Shapes: p_rows `[k + 1, V]` (the target's distributions at the k draft positions and the bonus), q_rows
`[k, V]`, drafts `[k]`.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.speculative.sampler import rejection_sample
from nwor_lab.viz.theme import TOKEN_COLOURS, KEPT, REJECTED, base_layout

P_COLOUR, Q_COLOUR = "#5b8fd0", "#e69f00"


def window_steps(target_logits: torch.Tensor, draft_probs: torch.Tensor, drafts: list[int], *, temperature: float,
                 seed: int) -> dict:
    """One request's window through `rejection_sample` (generator seeded `seed`) -> {"sampled" (the
    sampler's row), "accepted_len", "steps": [{"j", "x", "p_x", "q_x", "ratio", "u", "accepted"}],
    "next_probs" [V] (the law of the emitted token), "emitted", "p" [k + 1, V], "q" [k, V]}.

    target_logits `[k + 1, V]`, draft_probs `[k, V]`, drafts: k ids."""
    k, V = draft_probs.shape
    if target_logits.shape != (k + 1, V) or len(drafts) != k:
        raise ValueError(f"target_logits {tuple(target_logits.shape)}, draft_probs {tuple(draft_probs.shape)}, "
                         f"{len(drafts)} drafts: expected [k + 1, V], [k, V] and k ids")
    m = SpecDecodeMetadata.make_dummy([list(drafts)])
    sampled = rejection_sample(m, draft_probs, target_logits, temperature=temperature,
                               generator=torch.Generator().manual_seed(seed))[0].tolist()
    replay = torch.Generator().manual_seed(seed)
    torch.empty((1, V)).exponential_(generator=replay)                    # 1. the bonus noise
    u = torch.rand(k, dtype=torch.float64, generator=replay)             # 2. one u per draft
    p = torch.softmax(target_logits.float() / temperature, -1)
    q = draft_probs.float()
    steps, a = [], 0
    for j, x in enumerate(drafts):
        real = 0 <= x < V
        p_x, q_x = (float(p[j, x]), float(q[j, x])) if real else (0.0, 0.0)
        ok = real and q_x > 0 and (p_x / q_x) >= float(u[j])
        steps.append(dict(j=j + 1, x=x, p_x=p_x, q_x=q_x, ratio=p_x / q_x if q_x > 0 else None, u=float(u[j]),
                          accepted=ok and a == j))
        if ok and a == j:
            a += 1
    got = sum(t != -1 for t in sampled) - 1
    if got != a:
        raise RuntimeError(f"the replayed draws give {a} accepted drafts, the sampler {got}: the sampler's order of "
                           f"draws changed (nwor_lab.speculative.sampler's module doc)")
    if a == k:
        law = p[k].double()
    else:
        r = (p[a] - q[a]).clamp_min(0).double()
        law = r / r.sum() if float(r.sum()) > 0 else p[a].double()
    return dict(sampled=sampled, accepted_len=a, steps=steps, next_probs=law, emitted=sampled[a], p=p, q=q)


def emitted_distribution(p: torch.Tensor, q_draw: torch.Tensor, q_told: torch.Tensor | None = None) -> torch.Tensor:
    """The exact law `[V]` float64 of the first emitted token of a one-draft window: the draft x ~ q_draw,
    accepted with probability min(1, p(x) / q_told(x)) (0 when q_told(x) = 0), else a token from
    normalise(max(p − q_told, 0)). q_told None: a point mass on the drawn draft (the sampler told
    `draft_probs=None`, the right call only for a greedy drafter)."""
    p, q_draw = p.double(), q_draw.double()
    V = p.numel()
    out = torch.zeros(V, dtype=torch.float64)
    for x in range(V):
        if q_draw[x] == 0:
            continue
        told = torch.nn.functional.one_hot(torch.tensor(x), V).double() if q_told is None else q_told.double()
        acc = 0.0 if told[x] == 0 else min(1.0, float(p[x] / told[x]))
        r = (p - told).clamp_min(0)
        r = r / r.sum() if float(r.sum()) > 0 else p
        out += q_draw[x] * (acc * torch.nn.functional.one_hot(torch.tensor(x), V).double() + (1 - acc) * r)
    return out


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


def steps_figure(run: dict, *, subtitle: str | None = None) -> go.Figure:
    """One panel per draft (p and q over the vocabulary, the draft's bar outlined, the verdict), then the
    panel of the law the emitted token came from."""
    steps, a = run["steps"], run["accepted_len"]
    shown = steps[:a + 1]                                    # drafts after the first rejection are never tested
    k = len(steps)
    V = run["p"].shape[1]
    titles = []
    for s in shown:
        if s["ratio"] is None:
            titles.append(f"d{s['j']} = {s['x']}<br>rejected (q(x) = 0 or padding)")
        else:
            titles.append(f"d{s['j']} = {s['x']}: p/q = {s['ratio']:.2f} {'≥' if s['accepted'] else '<'} "
                          f"u = {s['u']:.2f}<br>{'accepted' if s['accepted'] else 'rejected'}")
    last = "bonus: p after every draft" if a == k else f"residual max(p − q, 0) at d{a + 1}"
    titles.append(f"{last}<br>emitted: {run['emitted']}")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.05)
    tokens = list(range(V))
    for c, s in enumerate(shown, start=1):
        j = s["j"] - 1
        fig.add_trace(go.Bar(x=tokens, y=run["p"][j].tolist(), name="target p", marker_color=P_COLOUR,
                             showlegend=c == 1, legendgroup="p"), row=1, col=c)
        fig.add_trace(go.Bar(x=tokens, y=run["q"][j].tolist(), name="draft q", marker_color=Q_COLOUR,
                             showlegend=c == 1, legendgroup="q"), row=1, col=c)
        if 0 <= s["x"] < V:
            fig.add_vrect(x0=s["x"] - 0.5, x1=s["x"] + 0.5, row=1, col=c, line_width=0,
                          fillcolor=TOKEN_COLOURS[KEPT if s["accepted"] else REJECTED], opacity=0.25)
    fig.add_trace(go.Bar(x=tokens, y=run["next_probs"].tolist(), name="law of the emitted token", marker_color="#4db58a"),
                  row=1, col=len(titles))
    fig.add_vrect(x0=run["emitted"] - 0.5, x1=run["emitted"] + 0.5, row=1, col=len(titles), line_width=0,
                  fillcolor="#4db58a", opacity=0.25)
    layout = base_layout("Rejection sampling, one draft at a time", subtitle)
    layout["margin"] = dict(layout["margin"], t=layout["margin"]["t"] + 40)   # room for two-line panel titles
    layout["title"] = dict(layout["title"], y=0.98, yanchor="top", yref="container")
    fig.update_layout(**layout, barmode="group", height=510, width=1250)
    for ann in fig.layout.annotations:
        ann.font = dict(size=12)
    fig.update_xaxes(title_text="token id", dtick=1)
    fig.update_yaxes(title_text="probability", row=1, col=1)
    return fig


def law_figure(laws: dict[str, torch.Tensor], *, title: str = "The law of the first emitted token",
               subtitle: str | None = None) -> go.Figure:
    """Bars per token: several laws of the emitted token side by side (the target's p first)."""
    fig = go.Figure()
    palette = [P_COLOUR, "#4db58a", "#e0603a", Q_COLOUR, "#b98bd6"]
    for i, (name, law) in enumerate(laws.items()):
        fig.add_trace(go.Bar(x=list(range(law.numel())), y=law.tolist(), name=name, marker_color=palette[i % 5]))
    fig.update_layout(**base_layout(title, subtitle), barmode="group", height=440,
                      width=1000)
    fig.update_xaxes(title="token id", dtick=1)
    fig.update_yaxes(title="probability")
    return fig


def acceptance_probability(p: torch.Tensor, q_draw: torch.Tensor, q_told: torch.Tensor | None = None) -> float:
    """The probability that a one-draft window accepts its draft (x ~ q_draw, accepted with probability
    min(1, p(x) / q_told(x)); q_told None: a point mass on x, min(1, p(x)))."""
    p, q_draw = p.double(), q_draw.double()
    told = q_draw.new_ones(q_draw.shape) if q_told is None else q_told.double()
    ratio = torch.where(told > 0, p / told.clamp_min(1e-300), torch.zeros_like(p))
    return float((q_draw * ratio.clamp(max=1.0)).sum())


def first_token_frequencies(draft_probs: torch.Tensor | None, draft_ids: torch.Tensor, p_logits: torch.Tensor,
                            n_samples: int, temperature: float = 1.0, seed: int = 1234) -> torch.Tensor:
    """The lab's distribution test (tests/test_sampler.py): `n_samples` one-request windows of two drafts
    each (draft i of window i is `draft_ids[i]`, twice) in ONE batched `rejection_sample` call, every
    target row `p_logits [V]`; -> the histogram `[V]` float64 of each window's first emitted token, which
    must follow softmax(p_logits / temperature) whatever q proposed. draft_probs `[V]` (q) or None (a
    point-mass drafter)."""
    vocab = p_logits.shape[0]
    m = SpecDecodeMetadata.make_dummy([[int(d), int(d)] for d in draft_ids])
    logits = p_logits.repeat(3 * n_samples, 1)   # 2 target rows + 1 bonus row per request
    probs = None if draft_probs is None else draft_probs.repeat(2 * n_samples, 1)
    out = rejection_sample(m, probs, logits, temperature=temperature, generator=torch.Generator().manual_seed(seed))
    return torch.bincount(out[:, 0].long(), minlength=vocab).double() / n_samples
