"""viz.sampling (chapter 17): the replayed draws agree with the lab's sampler, and the exact law of the
emitted token is p when the sampler is told the draft's q or a point mass, and is not when told another q."""
import plotly.graph_objects as go
import pytest
import torch

from nwor_lab.viz.sampling import (acceptance_probability, emitted_distribution, law_figure, steps_figure,
                                   total_variation, window_steps)


@pytest.mark.parametrize("seed", range(6))
def test_window_steps_replays_the_samplers_draws(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 5, generator=g) * 2
    q = torch.softmax(torch.randn(3, 5, generator=g) * 2, -1)
    drafts = torch.multinomial(q, 1, generator=g).squeeze(1).tolist()
    run = window_steps(logits, q, drafts, temperature=0.7, seed=seed)
    a = run["accepted_len"]
    assert run["sampled"][:a] == drafts[:a] and all(t == -1 for t in run["sampled"][a + 1:])
    assert abs(float(run["next_probs"].sum()) - 1) < 1e-9 and float(run["next_probs"][run["emitted"]]) > 0
    assert isinstance(steps_figure(run), go.Figure)


def test_window_steps_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"expected \[k \+ 1, V\], \[k, V\] and k ids"):
        window_steps(torch.zeros(3, 4), torch.full((3, 4), 0.25), [0, 1, 2], temperature=1.0, seed=0)


def test_the_exact_law_is_p_unless_the_sampler_is_told_another_q():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 2, -1)
    other = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 2, -1)
    assert total_variation(emitted_distribution(p, q, q), p) < 1e-12
    assert total_variation(emitted_distribution(p, q, None), p) < 1e-12          # a point mass is a valid proposal
    assert total_variation(emitted_distribution(p, q, other), p) > 1e-2
    assert acceptance_probability(p, q, None) < acceptance_probability(p, q, q)   # ... that accepts less
    assert acceptance_probability(p, q, q) == pytest.approx(float(torch.minimum(p, q).sum()))
    law_figure({"p": p, "told q": emitted_distribution(p, q, q)}).to_json()
