"""The gated DeltaNet references agree with each other, with the definition, and split anywhere."""
import pytest
import torch

from nwor_lab.ops.gated_delta import (causal_conv_reference, gated_delta_chunk_reference,
                                      gated_delta_recurrent_reference, gated_delta_rule, l2norm)
from nwor_lab.ops.generators import gated_delta_inputs


def by_definition(q, k, v, g, beta, state):
    """The recurrence written as matrices, one token at a time (float64)."""
    s = state.double().clone()
    outs = []
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            s[h] *= torch.exp(g[t, h].double())
            kt, vt = k[t, h].double(), v[t, h].double()
            s[h] += torch.outer(kt, beta[t, h].double() * (vt - kt @ s[h]))
        outs.append(torch.einsum("hk,hkv->hv", q[t].double() * q.shape[2] ** -0.5, s))
    return torch.stack(outs), s


def test_recurrent_matches_the_definition():
    c = gated_delta_inputs(7, seed=1)
    o, states = gated_delta_recurrent_reference(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"])
    want_o, want_s = by_definition(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"])
    torch.testing.assert_close(o.double(), want_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[-1].double(), want_s, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T,chunk,keep", [(5, 64, 0), (37, 16, 30), (64, 16, 60), (70, 64, None)])
def test_chunked_equals_recurrent(T, chunk, keep):
    """The WY form (prefill) gives the recurrent form's outputs and kept states to fp32 rounding."""
    c = gated_delta_inputs(T, seed=T)
    args = (c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"])
    o1, s1 = gated_delta_recurrent_reference(*args, keep_from=keep)
    o2, s2 = gated_delta_chunk_reference(*args, keep_from=keep, chunk_size=chunk)
    assert s1.shape == s2.shape == ((T - (T - 1 if keep is None else keep)),) + c["state"].shape
    torch.testing.assert_close(o2, o1, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s2, s1, atol=2e-5, rtol=1e-4)


def test_recurrent_split_anywhere_is_bit_exact():
    """Decoding rows one by one from the carried state is the window's computation, bit for bit:
    what makes every non-off strategy exact (nwor_lab.state)."""
    c = gated_delta_inputs(6, seed=3)
    names = ("q", "k", "v", "g", "beta")
    o, states = gated_delta_recurrent_reference(*(c[n] for n in names), c["state"], keep_from=0)
    s = c["state"]
    for t in range(6):
        o_t, s_t = gated_delta_recurrent_reference(*(c[n][t:t + 1] for n in names), s)
        assert torch.equal(o_t[0], o[t]) and torch.equal(s_t[0], states[t])
        s = s_t[0]


def test_conv_state_after_each_row_is_a_slice_of_the_history():
    c = gated_delta_inputs(9, seed=4)
    y, history = causal_conv_reference(c["x"], c["weight"], c["conv_state"])
    W = c["weight"].shape[1]
    dense = torch.nn.functional.conv1d(torch.cat([c["conv_state"], c["x"]]).t()[None], c["weight"][:, None],
                                       groups=c["x"].shape[1])[0].t()
    torch.testing.assert_close(y, dense)               # conv1d sums in its own order
    state = c["conv_state"]
    for t in range(9):
        y_t, h_t = causal_conv_reference(c["x"][t:t + 1], c["weight"], state)
        assert torch.equal(y_t[0], y[t])
        state = h_t[-(W - 1):]
        assert torch.equal(state, history[t + 1:t + W])


def test_conv_batched_rows_equal_single_rows():
    """Sequences batched together give each sequence's own result, bit for bit."""
    c = [gated_delta_inputs(6, seed=s) for s in (6, 7)]
    y, history = causal_conv_reference(torch.stack([a["x"] for a in c]), c[0]["weight"],
                                       torch.stack([a["conv_state"] for a in c]))
    for i, a in enumerate(c):
        y1, h1 = causal_conv_reference(a["x"], c[0]["weight"], a["conv_state"])
        assert torch.equal(y[i], y1) and torch.equal(history[i], h1)


def test_dispatch_on_cpu_is_the_reference():
    c = gated_delta_inputs(20, seed=5)
    args = (c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"])
    assert all(torch.equal(a, b) for a, b in zip(gated_delta_rule(*args, keep_from=18),
                                                  gated_delta_chunk_reference(*args, keep_from=18)))
    short = tuple(a[:4] if a.dim() and a.shape[0] == 20 else a for a in args)
    assert all(torch.equal(a, b) for a, b in zip(gated_delta_rule(*short),
                                                  gated_delta_recurrent_reference(*short)))


def test_bad_shapes_are_named():
    c = gated_delta_inputs(4)
    with pytest.raises(ValueError, match="v: expected"):
        gated_delta_recurrent_reference(c["q"], c["k"], c["v"][:, :1], c["g"], c["beta"])
    with pytest.raises(ValueError, match="keep_from"):
        gated_delta_recurrent_reference(c["q"], c["k"], c["v"], c["g"], c["beta"], keep_from=4)
    with pytest.raises(ValueError, match="conv_state"):
        causal_conv_reference(c["x"], c["weight"], c["conv_state"][:1])
    assert torch.allclose(l2norm(torch.tensor([[3.0, 4.0]])), torch.tensor([[0.6, 0.8]]), atol=1e-6)
