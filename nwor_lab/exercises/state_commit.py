"""Exercise (r): which recurrent state a verify window commits, and which conv inputs it keeps
(chapter 13).

Write `state_commit(window_states, conv_history, num_drafts, accepted_len, conv_width) -> (state,
conv_state)`; the spec is the docstring of `nwor_lab.exercises.solutions.state_commit`. Check it with
`exercises.check_state_commit(fn)`.

Cases: no request, every draft accepted (the same answer as `off`'s), none accepted (the state after
t_last), a plain decode beside a speculative request, a conv of width 2 (one entry), a conv wider
than the window (the kept entries reach back into the old conv state), requests with fewer drafts
than k (padding rows: NaN), random batches.

Every value tells where it came from: state entry s after window position j of request r is
100 r + 10 j + s; conv input of history entry i (position i - (W - 1) from t_last) of request r is
100 r + (i - (W - 1)) + c / 2. A counterexample names the position your answer took.
"""
from __future__ import annotations

import math

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, tensor_problem
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.theme import STATE_COLOURS, TOKEN_COLOURS, SlotState

STATE_SIZE, CHANNELS = 2, 2
CATEGORIES = [("conv state before the window", STATE_COLOURS[SlotState.OLD]),
              ("kept: t_last, d_1 .. d_a", TOKEN_COLOURS["kept"]),
              ("rejected draft", TOKEN_COLOURS["rejected"]), ("padding (no draft)", "#ffffff")]


def _case(num_drafts: list[int], accepted: list[int], k: int, conv_width: int, note: str = "random") -> Case:
    R, W = len(num_drafts), conv_width
    states = torch.full((R, k + 1, STATE_SIZE), math.nan)
    history = torch.full((R, W - 1 + k + 1, CHANNELS), math.nan)
    for r, n in enumerate(num_drafts):
        for j in range(n + 1):
            states[r, j] = torch.tensor([100.0 * r + 10 * j + s for s in range(STATE_SIZE)])
        for i in range(W - 1 + n + 1):
            history[r, i] = torch.tensor([100.0 * r + (i - (W - 1)) + c / 2 for c in range(CHANNELS)])
    return Case(dict(window_states=states, conv_history=history,
                     num_drafts=torch.tensor(num_drafts, dtype=torch.int64),
                     accepted_len=torch.tensor(accepted, dtype=torch.int64), conv_width=W), note)


def cases(seed: int, n: int):
    fixed = [
        _case([], [], 3, 4, "edge: no request"),
        _case([3], [3], 3, 4, "edge: every draft accepted (the one window where off's state is right)"),
        _case([3], [0], 3, 4, "edge: no draft accepted: the state after t_last"),
        _case([3], [1], 3, 4, "edge: d1 accepted (the state after d_a, not after d_{a+1})"),
        _case([0, 3], [0, 2], 3, 4, "edge: a plain decode (no drafts) beside a speculative request"),
        _case([4], [2], 4, 2, "edge: W = 2: the conv state is one input"),
        _case([2], [0], 2, 6, "edge: a conv wider than the window: kept inputs reach into the old conv state"),
        _case([4, 1, 2], [1, 1, 0], 4, 4, "edge: fewer drafts than k: padding rows (NaN) are never kept"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    reqs = growing(i, count, 1, 6)
    k, W = d.int(1, 6), d.int(2, 6)
    drafts = [d.choice((0, d.int(1, k), k, k)) for _ in range(reqs)]
    return _case(drafts, [d.int(0, n_) for n_ in drafts], k, W)


def _where(value: torch.Tensor, case: Case, what: str) -> str:
    """Which window position a returned row came from, read off its labelled value."""
    v = value.reshape(-1)[0].item()
    if math.isnan(v):
        return "a padding row (NaN)"
    if what == "state":                       # 100 r + 10 j + s, s < 10
        r = int(v // 100)
        j = int((v - 100 * r) // 10)
        return f"request {r}'s state after {'t_last' if j == 0 else f'd_{j}'}"
    r = round(v / 100)                        # 100 r + pos + c / 2, |pos| < 50
    pos = round(v - 100 * r)
    return f"request {r}'s input {'of t_last' if pos == 0 else f'of d_{pos}' if pos > 0 else f'{-pos} before t_last'}"


def compare(expected, got, case) -> str | None:
    if not isinstance(got, tuple) or len(got) != 2:
        return f"expected a tuple (state, conv_state), got {type(got).__name__}"
    for name, e, g in (("state", expected[0], got[0]), ("conv_state", expected[1], got[1])):
        problem = tensor_problem(e, g, name)
        if problem:
            return problem
        if not torch.equal(e, g):
            diff = ~(g == e).reshape(e.shape[0], -1).all(1)
            r = int(diff.nonzero()[0])
            if name == "state":
                return (f"state of request {r}: expected {_where(e[r], case, 'state')}, got "
                        f"{_where(g[r], case, 'state')} (accepted {int(case.inputs['accepted_len'][r])} of "
                        f"{int(case.inputs['num_drafts'][r])} drafts)")
            i = int((~(g[r] == e[r]).all(-1)).nonzero()[0])
            return (f"conv_state of request {r}, entry {i} (oldest first): expected "
                    f"{_where(e[r, i], case, 'conv')}, got {_where(g[r, i], case, 'conv')}")
    return None


def _row_index(rows, value) -> int | None:
    """The first row of `rows` equal to `value` (where a returned state or conv entry came from), or None."""
    return next((i for i in range(rows.shape[0]) if torch.equal(rows[i], value)), None)


def _show(out) -> str:
    state, conv = out
    return f"(state {state.tolist()}, conv_state {conv.tolist()})"


def draw(case, expected, got):
    i = case.inputs
    W, R = i["conv_width"], len(i["num_drafts"])
    k = i["window_states"].shape[1] - 1
    cols = [f"x{p}" for p in range(-(W - 1), 0)] + ["t_last"] + [f"d{j}" for j in range(1, k + 1)]

    def marks(answer):
        """Per request: the history column whose state is committed, the history columns kept."""
        out = []
        for r in range(R):
            try:
                j = _row_index(case.inputs["window_states"][r], answer[0][r])
                kept = [_row_index(case.inputs["conv_history"][r], answer[1][r, e]) for e in range(W - 1)]
            except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
                j, kept = None, []
            out.append((None if j is None else W - 1 + j, {c for c in kept if c is not None}))
        return out

    def panel(title, answer, other=None):
        z, text, hl = [], [], []
        for r in range(R):
            n, a = int(i["num_drafts"][r]), int(i["accepted_len"][r])
            zr, tr = [], []
            for c in range(len(cols)):
                j = c - (W - 1)
                zr.append(0 if j < 0 else 3 if j > n else 2 if j > a else 1)
                state_col, kept = answer[r]
                tr.append(" ".join(m for m, on in (("S", c == state_col), ("c", c in kept)) if on))
                if other is not None and (tr[-1] != " ".join(m for m, on in (("S", c == other[r][0]),
                                                                             ("c", c in other[r][1])) if on)):
                    hl.append((r, c))
            z.append(zr)
            text.append(tr)
        rows = [f"req {r}: a={int(i['accepted_len'][r])} of {int(i['num_drafts'][r])}" for r in range(R)]
        return dict(z=z, text=text, rows=rows, cols=cols, title=title, highlight=hl)

    want, yours = marks(expected), marks(got)
    return labelled_grids([panel("expected", want), panel("your state_commit", yours, want)],
                          categories=CATEGORIES, stacked=True,
                          title="state_commit: the state to commit and the conv inputs to keep",
                          subtitle=f"{case.note}; W = {W}, k = {k}. S: the position whose state is committed; "
                                   f"c: a conv input kept (W - 1 of them); outlined where yours differs",
                          x_title="the conv's inputs: its state before the window, then the window's tokens")


PREDICT = Prediction(
    question="k = 4 drafts, conv width W = 4; the sampler accepted 2 drafts. Of the conv inputs written during "
             "the window (t_last, d1 .. d4), which does the conv state keep after the commit? (a list of names, "
             "oldest first, e.g. ['t_last', 'd1'])",
    inputs=lambda: _case([4], [2], 4, 4).inputs,
    answer=lambda out: [("t_last" if p == 0 else f"d{p}") for p in
                        (round(v) for v in out[1][0, :, 0].tolist()) if p >= 0],
    explain=lambda names: (f"{names}: the conv state holds the W - 1 = 3 inputs that end with the last kept "
                           f"token d2 — one input from before the window, then t_last, d1, d2. The state to "
                           f"commit is the one after d2: the third of the window's five states."))

HINTS = (
    "Only the accepted length matters: t_last, d_1 .. d_a are kept, so the state to commit is window_states[r, a] "
    "(row 0 is the state after t_last). num_drafts tells you which rows are padding; `off` would take row n.",
    "In conv_history, entry W - 1 is t_last's input and entry W - 1 + a is d_a's. The W - 1 entries ending there "
    "are a + 1 .. a + W - 1: conv_history[r, a + 1 : a + W]. Index all requests at once with torch.arange and "
    "return float32 tensors (an empty batch gives shapes [0, S] and [0, W - 1, C]).",
)

EXERCISE = Exercise("state_commit", cases, compare, draw, _show, hints=HINTS, predict=PREDICT)
