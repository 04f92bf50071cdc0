"""Exercise (w): one request's verify window at temperature > 0: the accepted length and the
distribution the target's own token is drawn from (chapter 17).

Write `sampled_verdict(draft_ids, target_probs, draft_probs, u) -> (a, next_probs)`; the spec is the
docstring of `nwor_lab.exercises.solutions.sampled_verdict`. Check it with `exercises.check_sampled_verdict(fn)`.

Cases: every draft accepted (the bonus row), the first draft rejected, a ratio exactly equal to u
(accepted: the test is >=), a draft whose own probability is 0 (rejected however large p is), a
padding draft −1 (rejected, never an index: p[−1] would read the last token's probability), a rejection
where q equals p (residual all zero: p itself), then random windows. Distributions are compared to
1e-12; `a` must be a Python int.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from nwor_lab.exercises.cases import Dice, edge_then_random
from nwor_lab.exercises.check import Case, Exercise, Prediction, tensor_problem
from nwor_lab.viz.theme import base_layout

TOL = 1e-12


def _probs(rows) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.sum(-1, keepdim=True)


def _case(drafts, p, q, u, note="random") -> Case:
    return Case(dict(draft_ids=torch.tensor(drafts, dtype=torch.int64), target_probs=_probs(p), draft_probs=_probs(q),
                     u=torch.tensor(u, dtype=torch.float64)), note)


def _random(d: Dice) -> Case:
    V, k = d.int(2, 6), d.int(1, 4)
    g = d.gen
    p = torch.softmax(torch.randn(k + 1, V, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(k, V, generator=g, dtype=torch.float64) * 1.5, -1)
    if d.chance(0.2):                                   # a drafter that rules a token out
        q[d.int(0, k - 1), d.int(0, V - 1)] = 0.0
        q = q / q.sum(-1, keepdim=True)
    drafts = torch.multinomial(q, 1, generator=g).squeeze(1)
    if d.chance(0.15):
        drafts[d.int(0, k - 1)] = -1
    u = torch.rand(k, generator=g, dtype=torch.float64) * (0.6 if d.chance(0.5) else 1.0)
    return Case(dict(draft_ids=drafts.long(), target_probs=p, draft_probs=q, u=u), "random")


def cases(seed: int, n: int):
    fixed = [
        _case([1, 2], [[1, 6, 1, 2], [1, 1, 6, 2], [4, 3, 2, 1]], [[1, 4, 1, 4], [1, 1, 4, 4]], [0.3, 0.5],
              note="edge: every draft accepted (the bonus row)"),
        _case([3, 0], [[5, 2, 2, 1], [1, 1, 1, 1], [1, 1, 1, 1]], [[1, 1, 1, 7], [1, 1, 1, 1]], [0.9, 0.1],
              note="edge: the first draft rejected"),
        _case([0], [[1, 3], [1, 1]], [[1, 1]], [0.5], note="edge: p/q exactly equal to u (accepted: >=)"),
        _case([2, 1], [[1, 1, 6], [1, 6, 1], [1, 1, 1]], [[1, 1, 0], [1, 1, 1]], [0.01, 0.5],
              note="edge: the draft's own probability is 0 (rejected)"),
        _case([1, -1], [[1, 8, 1], [1, 1, 8], [1, 1, 1]], [[1, 2, 1], [1, 1, 2]], [0.2, 0.01],
              note="edge: a padding draft -1 (rejected, never an index)"),
        _case([-1], [[1, 2, 5], [1, 1, 1]], [[1, 2, 5]], [0.5],
              note="edge: rejected where q equals p (the residual is all zero: p itself)"),
        _case([0, 1, 2], [[1, 2, 1], [1, 2, 1], [1, 1, 2], [3, 1, 1]], [[1, 1, 1], [1, 1, 1], [1, 1, 1]],
              [0.95, 0.1, 0.1], note="edge: rejected first, later drafts would pass"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    return _random(d)


def compare(expected, got, case) -> str | None:
    a, probs = expected
    if not (isinstance(got, tuple) and len(got) == 2):
        return f"expected a tuple (a, next_probs), got {type(got).__name__}"
    ga, gp = got
    if isinstance(ga, bool) or not isinstance(ga, int):
        return f"a: expected a Python int, got {type(ga).__name__} (use int(...))"
    i = case.inputs
    ratio = []
    for j, x in enumerate(i["draft_ids"].tolist()):
        V = i["target_probs"].shape[1]
        if 0 <= x < V and float(i["draft_probs"][j, x]) > 0:
            ratio.append(f"d{j + 1}={x}: p/q = {float(i['target_probs'][j, x]) / float(i['draft_probs'][j, x]):.4g} "
                         f"vs u = {float(i['u'][j]):.4g}")
        else:
            ratio.append(f"d{j + 1}={x}: {'padding / outside the vocabulary' if not 0 <= x < V else 'q(x) = 0'}")
    if ga != a:
        return f"accepted length: expected {a}, got {ga}. Per draft: " + "; ".join(ratio)
    problem = tensor_problem(probs, gp, "next_probs")
    if problem:
        return problem
    if not torch.allclose(gp, probs, atol=TOL, rtol=0):
        where = "the bonus row p_k" if a == len(ratio) else f"the residual max(p_{a} − q_{a}, 0), normalised"
        return (f"next_probs: expected {[round(v, 4) for v in probs.tolist()]} ({where}), got "
                f"{[round(v, 4) for v in gp.tolist()]} (sum {float(gp.sum()):.4g})")
    return None


def _show(out) -> str:
    a, p = out
    return f"a = {a}, next_probs = {[round(v, 4) for v in torch.as_tensor(p).tolist()]}"


def draw(case, expected, got):
    a, probs = expected
    V = probs.numel()
    fig = go.Figure(go.Bar(x=list(range(V)), y=probs.tolist(), name=f"expected (a = {a})", marker_color="#5b8fd0"))
    try:
        ga, gp = got
        fig.add_trace(go.Bar(x=list(range(V)), y=torch.as_tensor(gp).double().tolist(), name=f"yours (a = {ga})",
                             marker_color="#e0603a"))
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        pass
    fig.update_layout(**base_layout("sampled_verdict: the distribution of the token after the accepted drafts",
                                    f"{case.note}; drafts {case.inputs['draft_ids'].tolist()}, u = "
                                    f"{[round(x, 3) for x in case.inputs['u'].tolist()]}"),
                      barmode="group", height=420, width=800)
    fig.update_xaxes(title="token id", dtick=1)
    fig.update_yaxes(title="probability")
    return fig


PREDICT = Prediction(
    question="Vocabulary of 3, one draft d1 = 2 sampled from q = [0.2, 0.2, 0.6]; the target says p = [0.5, 0.3, 0.2] "
             "and u = 0.5. Is d1 accepted, and what is the distribution of the next token? (a tuple: (a, list of "
             "three probabilities rounded to 2 decimals))",
    inputs=lambda: _case([2], [[0.5, 0.3, 0.2], [1, 1, 1]], [[0.2, 0.2, 0.6]], [0.5]).inputs,
    answer=lambda out: (out[0], [round(v, 2) for v in out[1].tolist()]),
    explain=lambda ans: (f"{ans}: p(2)/q(2) = 0.2/0.6 ≈ 0.33 < u = 0.5, so d1 is rejected (a = 0). The residual "
                         f"max(p − q, 0) = [0.3, 0.1, 0] sums to 0.4; normalised it is [0.75, 0.25, 0]. Token 2, which "
                         f"q over-proposed, cannot come out of the residual: accepted with probability 0.6 × 1/3 = 0.2 "
                         f"= p(2), it is already exactly as likely as under the target."))

HINTS = (
    "Walk the drafts in order and stop at the first one that fails: its id must be a real token (0 <= x < V: test "
    "before indexing, −1 would index the last token), q_j(x) > 0, and p_j(x) / q_j(x) >= u_j. Count the ones "
    "that pass: that is a.",
    "If a == k, the next token is the bonus: return target_probs[k]. Otherwise r = (target_probs[a] − "
    "draft_probs[a]).clamp_min(0); return r / r.sum(), or target_probs[a] when r.sum() == 0.",
)

EXERCISE = Exercise("sampled_verdict", cases, compare, draw, _show, hints=HINTS, predict=PREDICT)
