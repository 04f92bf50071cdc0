"""A recurrent layer's verify window, drawn (chapter 13): the state chain, what each state strategy
keeps, and the conv state's ring of W - 1 inputs.

    S_0 --t_last--> S_1 --d_1--> S_2 ... --d_k--> S_{k+1}

S_0 is the committed state; S_{j+1} the state after window row j (t_last, then the drafts). With a
drafts accepted, the state to commit is S_{a+1}; S_{a+2} .. S_{k+1} have absorbed a rejected draft.
What a strategy keeps follows from what its policy declares (`advances_live`, `keeps_window_states`,
`keeps_window_inputs`, `checkpoints`, `commits_accepted_only`, `rows_per_slot`), never from its name.
"""
from __future__ import annotations

import plotly.graph_objects as go

from nwor_lab.viz.states import SlotState
from nwor_lab.viz.categories import add_category_legend, category_heatmap
from nwor_lab.viz.theme import CELL_FONT, HIGHLIGHT, LEGEND_PX, STATE_COLOURS, TOKEN_COLOURS, base_layout

SUB = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
COMMITTED, CANDIDATE, ABSORBED = STATE_COLOURS[SlotState.COMMITTED], STATE_COLOURS[SlotState.WRITTEN], \
    TOKEN_COLOURS["rejected"]


def state_name(j: int) -> str:
    return f"S{j}".translate(SUB)


def token_name(j: int) -> str:
    """Window row j: t_last (0), d₁ .. d_k."""
    return "t_last" if j == 0 else f"d{j}".translate(SUB)


def _check(k: int, accepted: int) -> None:
    if not 1 <= k <= 9 or not 0 <= accepted <= k:
        raise ValueError(f"k={k}, accepted={accepted}: draw 1 <= k <= 9 drafts and 0 <= accepted <= k")


def recurrent_window_figure(k: int, accepted: int, *, title: str | None = None) -> go.Figure:
    """The state chain of one verify window: S_0 (committed) advanced by t_last, d_1 .. d_k; the kept
    tokens and the rejected drafts coloured, S_{a+1} (the state to commit) outlined."""
    _check(k, accepted)
    fig = go.Figure()
    xs = [2 * j for j in range(k + 2)]
    colour = [COMMITTED] + [CANDIDATE if j <= accepted + 1 else ABSORBED for j in range(1, k + 2)]
    hover = ["S₀: the committed state (before the window)"] + [
        f"{state_name(j)}: after {token_name(j - 1)}" + (" — the state to commit" if j == accepted + 1 else
                                                          " — holds a rejected draft's update" if j > accepted + 1 else
                                                          " — holds accepted tokens only") for j in range(1, k + 2)]
    for j in range(k + 1):                       # the token that advances S_j to S_{j+1}
        kept = j <= accepted
        fig.add_annotation(x=xs[j + 1] - 0.45, y=1, ax=xs[j] + 0.45, ay=1, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=2, arrowwidth=2, arrowcolor="#555555", text="")
        fig.add_annotation(x=xs[j] + 1, y=0.75, ax=xs[j] + 1, ay=0.37, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=2, arrowwidth=1.5,
                           arrowcolor=TOKEN_COLOURS["kept"] if kept else TOKEN_COLOURS["rejected"], text="")
    fig.add_trace(go.Scatter(
        x=[xs[j] + 1 for j in range(k + 1)], y=[0.12] * (k + 1), mode="markers+text",
        text=[token_name(j) for j in range(k + 1)], textfont=dict(size=13, color="#111111"),
        marker=dict(symbol="square", size=54, color=[TOKEN_COLOURS["kept"] if j <= accepted else TOKEN_COLOURS["rejected"]
                                                      for j in range(k + 1)], line=dict(color="#777777", width=1)),
        hovertext=[f"{token_name(j)}: " + ("kept" if j <= accepted else "rejected draft") for j in range(k + 1)],
        hoverinfo="text", showlegend=False))
    fig.add_trace(go.Scatter(
        x=xs, y=[1] * (k + 2), mode="markers+text", text=[state_name(j) for j in range(k + 2)],
        textfont=dict(size=16, color="#111111"), hovertext=hover, hoverinfo="text", showlegend=False,
        marker=dict(symbol="square", size=58, color=colour,
                    line=dict(color=[HIGHLIGHT if j == accepted + 1 else "#777777" for j in range(k + 2)],
                              width=[5 if j == accepted + 1 else 1 for j in range(k + 2)]))))
    fig.add_annotation(x=xs[accepted + 1], y=1.6, text=f"<b>commit {state_name(accepted + 1)}</b><br>"
                       f"(a = {accepted}: the state after {token_name(accepted)})", showarrow=False,
                       font=dict(color=HIGHLIGHT, size=13))
    fig.add_annotation(x=xs[0], y=1.6, text="committed<br>before the window", showarrow=False, font=dict(size=12))
    if accepted < k:
        fig.add_annotation(x=(xs[accepted + 2] + xs[-1]) / 2, y=1.6,
                           text="absorbed a rejected draft:<br>no bookkeeping takes it out", showarrow=False,
                           font=dict(color=ABSORBED, size=12))
    add_category_legend(fig, [("committed state S₀", COMMITTED), ("state over accepted tokens only", CANDIDATE),
                              ("state that absorbed a rejected draft", ABSORBED), ("kept token", TOKEN_COLOURS["kept"]),
                              ("rejected draft", TOKEN_COLOURS["rejected"])])
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="the state to commit", hoverinfo="skip",
                             marker=dict(symbol="square-open", size=13, color=HIGHLIGHT, line=dict(width=3))))
    fig.update_layout(**base_layout(title or f"One verify window through a recurrent layer: k = {k}, {accepted} accepted",
                                    "S<sub>j+1</sub> = (I − β k kᵀ) · exp(g) S<sub>j</sub> + β k vᵀ for each row j "
                                    "(the gated delta rule, per head): every row updates the state, drafts included"),
                      height=390 + LEGEND_PX, width=min(1100, 240 + 115 * (k + 2)))
    fig.update_layout(margin_t=fig.layout.margin.t + 10, margin_b=40 + LEGEND_PX)
    fig.update_xaxes(visible=False, range=[-1, xs[-1] + 1])
    fig.update_yaxes(visible=False, range=[-0.2, 1.85])
    return fig


# what a strategy holds, per window item (state S_j or row j's layer inputs)
KEEPS = [("not kept", "#ffffff"), ("in the store: held for the request's life", COMMITTED),
         ("held only while the window is open", STATE_COLOURS[SlotState.STAGED]),
         ("in the store after commit: accepted tokens only", STATE_COLOURS[SlotState.RESTORED]),
         ("in the store after commit: holds rejected drafts", ABSORBED)]


def keeps_during_window(cls, k: int) -> dict:
    """From a state policy's declarations: {("S", j) or ("x", j): (category index, label)} of what it
    holds while a window of k drafts is open (j = 0 .. k+1 for states, 0 .. k for rows' inputs)."""
    out = {}
    if cls.rows_per_slot(k) > 1:                       # one store row per window position
        for j in range(1, k + 2):
            out["S", j] = (1, f"row {j - 1}")
    elif cls.advances_live:                           # the committed row is advanced through every row
        out["S", k + 1] = (1, "live")
        if cls.checkpoints:
            out["S", 0] = (2, "checkpoint")
    else:                                             # the committed row waits untouched
        out["S", 0] = (1, "store")
    if cls.keeps_window_states and cls.rows_per_slot(k) == 1:
        for j in range(1, k + 2):
            out["S", j] = (2, "buffer")
    if cls.keeps_window_inputs:
        for j in range(k + 1):
            out["x", j] = (2, "inputs")
    return out


def commit_action(cls, k: int) -> str:
    """What the commit does, from the declarations."""
    if not cls.commits_accepted_only:
        return f"nothing: keeps {state_name(k + 1)}"
    if cls.rows_per_slot(k) > 1:
        return "current → row a"
    if cls.checkpoints:
        return "restore S₀, re-advance"
    if cls.keeps_window_inputs:
        return "recompute from S₀"
    if cls.keeps_window_states:
        return "copy S<sub>a+1</sub> in"
    return "?"


def strategy_keeps_figure(policies: dict, k: int, accepted: int, *, title: str | None = None) -> go.Figure:
    """One row per strategy (`{name: StatePolicy subclass}`): what it holds of the window's states
    S_0 .. S_{k+1} and rows' inputs x(t_last) .. x(d_k) while the window is open, and what the store
    holds after the commit."""
    _check(k, accepted)
    cols = []
    for j in range(k + 1):
        cols += [("S", j), ("x", j)]
    cols.append(("S", k + 1))
    labels = [state_name(j) if kind == "S" else f"x({token_name(j)})" for kind, j in cols] + ["after commit"]
    names = list(policies)
    z, text, hover = [], [], []
    for name in names:
        cls = policies[name]
        held = keeps_during_window(cls, k)
        zr = [held.get(c, (0, ""))[0] for c in cols]
        tr = [held.get(c, (0, ""))[1] for c in cols]
        hr = [f"{name}: {lab} — {KEEPS[v][0]}" for lab, v in zip(labels, zr)]
        right = cls.commits_accepted_only
        zr.append(3 if right else 4)
        tr.append(state_name(accepted + 1) if right else f"{state_name(k + 1)} ✗")
        hr.append(f"{name}: the store holds {tr[-1]} — commit: {commit_action(cls, k)}")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    fig = go.Figure(category_heatmap(
        z, KEEPS, x=list(range(len(labels))), y=names, text=text, texttemplate="%{text}", textfont=CELL_FONT,
        customdata=hover, hovertemplate="%{customdata}<extra></extra>", xgap=2, ygap=2))
    for r, name in enumerate(names):
        fig.add_annotation(x=len(labels) - 0.4, y=r, text=commit_action(policies[name], k), showarrow=False,
                           xanchor="left", font=dict(size=12))
    fig.add_shape(type="rect", x0=2 * (accepted + 1) - 0.5, x1=2 * (accepted + 1) + 0.5, y0=-0.5,
                  y1=len(names) - 0.5, line=dict(color=HIGHLIGHT, width=3))
    add_category_legend(fig, KEEPS[1:])
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{state_name(accepted + 1)}: the state to commit",
                             hoverinfo="skip", marker=dict(symbol="square-open", size=13, color=HIGHLIGHT,
                                                           line=dict(width=3))))
    fig.update_layout(**base_layout(title or f"What each strategy keeps while a window is open (k = {k}, "
                                              f"{accepted} accepted), and what its commit leaves in the store",
                                    "S<sub>j</sub>: the state after j window rows; x(·): a row's layer inputs (conv "
                                    "input, q, k, v, g, β); cells say where each is held"),
                      height=150 + LEGEND_PX + 46 * len(names), width=1100, showlegend=True)
    fig.update_xaxes(tickvals=list(range(len(labels))), ticktext=labels, showgrid=False, zeroline=False,
                     range=[-0.5, len(labels) + 2.6], title_text="the window: states S<sub>j</sub> and each row's "
                     "inputs x(·), in order; then the store after the commit and what the commit does")
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False, title_text="strategy")
    return fig


def conv_ring_figure(conv_width: int, k: int, accepted: int, *, title: str | None = None) -> go.Figure:
    """The short conv's state: the last W - 1 inputs, a ring (position p in entry p mod (W - 1)).
    Columns: the W - 1 inputs before the window, then the window's rows; rows: what the conv state
    holds before the window, after it under a strategy that keeps every row (`off`), and after a
    commit of `accepted` drafts."""
    _check(k, accepted)
    if conv_width < 2:
        raise ValueError(f"conv_width={conv_width}: a conv of width >= 2 keeps a state")
    W = conv_width
    n = W - 1 + k + 1
    rel = list(range(-(W - 1), k + 1))                 # position relative to t_last
    labels = [f"x(n−{-p})" for p in rel[:W - 1]] + [f"x({token_name(j)})" for j in range(k + 1)]
    fate = [0 if p < 0 else 1 if p <= accepted else 2 for p in rel]
    fate_colours = [STATE_COLOURS[SlotState.OLD], TOKEN_COLOURS["kept"], TOKEN_COLOURS["rejected"]]

    def kept(end):            # history indices of the W - 1 inputs ending with relative position `end`
        return set(range(end + 1, end + W))

    rows = [("before the window", kept(-1)), ("after the window, every row kept (off)", kept(k)),
            (f"after commit, a = {accepted}", kept(accepted))]
    z, text = [], []
    for _, idx in rows:
        z.append([fate[i] if i in idx else None for i in range(n)])
        text.append([f"ring {(rel[i]) % (W - 1)}" if i in idx else "" for i in range(n)])
    fates = list(zip(("input from before the window", "input of a kept token", "input of a rejected draft"),
                     fate_colours))
    fig = go.Figure(category_heatmap(z, fates, x=labels, y=[r for r, _ in rows], text=text, texttemplate="%{text}",
                                     textfont=CELL_FONT, xgap=3, ygap=3, hoverinfo="skip"))
    add_category_legend(fig, fates)
    fig.update_layout(**base_layout(title or f"The conv state: a ring of W − 1 = {W - 1} inputs (W = {W}, k = {k}, "
                                              f"{accepted} accepted)",
                                    "n: t_last's position. Each row shows the inputs the conv state holds and the "
                                    "ring entry each sits in (position mod (W − 1)); a new token overwrites the "
                                    "oldest entry"),
                      height=320 + LEGEND_PX, width=min(1100, 330 + 78 * n))
    fig.update_layout(plot_bgcolor="#f7f7f7")
    fig.update_xaxes(showgrid=False, zeroline=False, title_text="the conv's inputs, oldest first")
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False)
    return fig
