"""Exercise (w) sampled_verdict (chapter 17): planted wrong answers are caught, in words and in a
picture, and the reference agrees with the lab's rejection sampler."""
import pytest
import torch

from exercise_tools import caught
from nwor_lab import exercises
from nwor_lab.exercises import solutions


def _walk(draft_ids, p, q, u, accept):
    k, V = q.shape
    a = 0
    while a < k and accept(int(draft_ids[a]), a, p, q, u, V):
        a += 1
    return a


def _next(a, p, q):
    if a == q.shape[0]:
        return p[a].clone()
    r = (p[a] - q[a]).clamp_min(0)
    return r / r.sum() if float(r.sum()) > 0 else p[a].clone()


def _ok(x, j, p, q, u, V):
    return 0 <= x < V and float(q[j, x]) > 0 and float(p[j, x]) / float(q[j, x]) >= float(u[j])


def inverted_ratio(draft_ids, target_probs, draft_probs, u):
    a = _walk(draft_ids, target_probs, draft_probs, u, lambda x, j, p, q, u, V: 0 <= x < V and float(p[j, x]) > 0
              and float(q[j, x]) / float(p[j, x]) >= float(u[j]))
    return a, _next(a, target_probs, draft_probs)


def counts_past_a_rejection(draft_ids, target_probs, draft_probs, u):
    a = sum(_ok(int(x), j, target_probs, draft_probs, u, draft_probs.shape[1]) for j, x in enumerate(draft_ids))
    return a, _next(a, target_probs, draft_probs)


def residual_not_normalised(draft_ids, target_probs, draft_probs, u):
    a = _walk(draft_ids, target_probs, draft_probs, u, _ok)
    return a, target_probs[a].clone() if a == draft_probs.shape[0] else (target_probs[a] - draft_probs[a]).clamp_min(0)


def resamples_from_p(draft_ids, target_probs, draft_probs, u):
    a = _walk(draft_ids, target_probs, draft_probs, u, _ok)
    return a, target_probs[a].clone()


def accepts_zero_q(draft_ids, target_probs, draft_probs, u):
    a = _walk(draft_ids, target_probs, draft_probs, u, lambda x, j, p, q, u, V: 0 <= x < V and (
        float(q[j, x]) == 0 or float(p[j, x]) / float(q[j, x]) >= float(u[j])))
    return a, _next(a, target_probs, draft_probs)


def indexes_padding(draft_ids, target_probs, draft_probs, u):
    a = _walk(draft_ids, target_probs, draft_probs, u, lambda x, j, p, q, u, V: float(q[j, x]) > 0
              and float(p[j, x]) / float(q[j, x]) >= float(u[j]))
    return a, _next(a, target_probs, draft_probs)


def strict_test(draft_ids, target_probs, draft_probs, u):
    a = _walk(draft_ids, target_probs, draft_probs, u, lambda x, j, p, q, u, V: 0 <= x < V and float(q[j, x]) > 0
              and float(p[j, x]) / float(q[j, x]) > float(u[j]))
    return a, _next(a, target_probs, draft_probs)


def empty_residual_nan(draft_ids, target_probs, draft_probs, u):
    a = _walk(draft_ids, target_probs, draft_probs, u, _ok)
    if a == draft_probs.shape[0]:
        return a, target_probs[a].clone()
    r = (target_probs[a] - draft_probs[a]).clamp_min(0)
    return a, r / r.sum()


@pytest.mark.parametrize("fn, note, words", [
    (inverted_ratio, "the first draft rejected", "accepted length"),
    (counts_past_a_rejection, "the first draft rejected", "accepted length"),
    (residual_not_normalised, "the first draft rejected", "residual"),
    (resamples_from_p, "the first draft rejected", "residual"),
    (accepts_zero_q, "own probability is 0", "q(x) = 0"),
    (indexes_padding, "padding draft -1", "padding"),
    (strict_test, "exactly equal to u", "accepted length"),
    (empty_residual_nan, "residual is all zero", "next_probs"),
])
def test_sampled_verdict_checker_finds_the_usual_mistakes(fn, note, words):
    caught("sampled_verdict", fn, note, words)


def test_sampled_verdict_checker_wants_an_int_and_float64():
    r = exercises.check("sampled_verdict", lambda **kw: (torch.tensor(solutions.sampled_verdict(**kw)[0]),
                                                         solutions.sampled_verdict(**kw)[1]), show=False)
    assert r.status == "fail" and "Python int" in r.message, r.message
    r = exercises.check("sampled_verdict", lambda **kw: (solutions.sampled_verdict(**kw)[0],
                                                         solutions.sampled_verdict(**kw)[1].float()), show=False)
    assert r.status == "fail" and "float32" in r.message, r.message


def test_the_reference_agrees_with_the_lab_sampler():
    """The same uniforms the lab's sampler draws (vLLM's order: bonus noise, then one u per draft): the
    accepted length is the reference's for every request of a random batch."""
    from nwor_lab.speculative.metadata import SpecDecodeMetadata
    from nwor_lab.speculative.sampler import rejection_sample
    g = torch.Generator().manual_seed(4)
    V, drafts = 5, [[1, 3, 0], [2], [4, 4], [0, 1, 2]]
    m = SpecDecodeMetadata.make_dummy(drafts)
    total, R = sum(map(len, drafts)), len(drafts)
    logits = torch.randn(total + R, V, generator=g)
    q = torch.softmax(torch.randn(total, V, generator=g), -1)
    out = rejection_sample(m, q, logits, temperature=1.0, generator=torch.Generator().manual_seed(9))
    replay = torch.Generator().manual_seed(9)
    torch.empty((R, V)).exponential_(generator=replay)                 # the bonus noise comes first
    u = torch.rand(total, dtype=torch.float64, generator=replay)
    p = torch.softmax(logits.float(), -1).double()
    d0 = 0
    for r, ds in enumerate(drafts):
        rows = list(range(d0 + r, d0 + r + len(ds) + 1))                # its target rows, then its bonus row
        a, _ = solutions.sampled_verdict(torch.tensor(ds), p[rows], q[d0:d0 + len(ds)].double(), u[d0:d0 + len(ds)])
        assert int((out[r] != -1).sum()) - 1 == a, (r, out[r], a)
        d0 += len(ds)
