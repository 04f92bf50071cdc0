"""A second recurrence behind the state store's seam: Mamba2's selective scan. Its torch references
against a naive loop, its identity input (dt = 0), and every registered state strategy over it
through the StatePolicy lifecycle, with nothing in the base class or the strategies naming it."""
import math

import pytest
import torch

from nwor_lab.ops.gated_delta import causal_conv_reference
from nwor_lab.ops.generators import selective_scan_inputs
from nwor_lab.ops.selective_scan import selective_scan_chunk_reference, selective_scan_reference
from nwor_lab.state import STATE_POLICIES, RecurrentSpec, RecurrentStateStore, memory_rows
from nwor_lab.state.mamba2 import Mamba2Recurrence
from nwor_lab.window import Acceptance, Window

H, N, P, CONV, W = 2, 4, 3, 10, 4
SPEC = RecurrentSpec(num_layers=2, num_heads=H, head_k_dim=N, head_v_dim=P, conv_dim=CONV, conv_width=W,
                     recurrence=Mamba2Recurrence())
K = 3
ROW_INPUTS = ("x", "dt", "B", "C")


def naive_scan(x, dt, A, B, C, D, h0):
    """The recurrence element by element in Python floats (float64): h[n, p] = exp(dt A) h[n, p] +
    dt B[n] x[p]; y[p] = sum_n C[n] h[n, p] + D x[p]."""
    T = x.shape[0]
    h = h0.double().clone()
    y, states = torch.zeros(T, H, P, dtype=torch.float64), []
    for t in range(T):
        for hd in range(H):
            a, d = math.exp(float(dt[t, hd]) * float(A[hd])), float(dt[t, hd])
            for n in range(N):
                for p in range(P):
                    h[hd, n, p] = a * float(h[hd, n, p]) + d * float(B[t, hd, n]) * float(x[t, hd, p])
            for p in range(P):
                y[t, hd, p] = sum(float(C[t, hd, n]) * float(h[hd, n, p]) for n in range(N)) \
                    + float(D[hd]) * float(x[t, hd, p])
        states.append(h.clone())
    return y, torch.stack(states)


def test_references_match_a_naive_loop():
    c = selective_scan_inputs(6, H, N, P, seed=1)
    args = (c["x"], c["dt"], c["A"], c["B"], c["C"], c["D"], c["state"])
    y_naive, states_naive = naive_scan(*args)
    for reference in (selective_scan_reference, selective_scan_chunk_reference):
        y, kept = reference(*args, keep_from=2)
        assert kept.shape == (4, H, N, P)
        torch.testing.assert_close(y.double(), y_naive, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kept.double(), states_naive[2:], rtol=1e-5, atol=1e-5)
    # keep_from None: the final state only; no state given: zeros
    _, final = selective_scan_reference(*args[:6])
    torch.testing.assert_close(final[0].double(), naive_scan(*args[:6], torch.zeros(H, N, P))[1][-1],
                               rtol=1e-5, atol=1e-5)


def test_dt_zero_leaves_the_state_bit_for_bit():
    """The identity the strategies mask rejected and padding rows with: exp(0 * A) is exactly 1 and
    the write vanishes, so rows with dt = 0 leave a (non-zero) state with the same bits."""
    c = selective_scan_inputs(5, H, N, P, seed=2)
    assert torch.equal((torch.zeros(H) * c["A"]).exp(), torch.ones(H))
    assert Mamba2Recurrence.identity == {"dt": 0.0}
    dt = c["dt"].clone()
    dt[2:] = 0
    _, masked = selective_scan_reference(c["x"], dt, c["A"], c["B"], c["C"], None, c["state"], keep_from=1)
    _, prefix = selective_scan_reference(c["x"][:2], c["dt"][:2], c["A"], c["B"][:2], c["C"][:2], None,
                                         c["state"], keep_from=1)
    assert masked[0].ne(0).all()
    assert all(torch.equal(s.view(torch.int32), prefix[0].view(torch.int32)) for s in masked)


def test_spec_and_errors():
    assert SPEC.state_shape == (H, N, P) and SPEC.state_bytes_layer == H * N * P * 4
    assert SPEC.token_input_bytes == 2 * (CONV * 4 + (H * P + H + 2 * H * N) * 4)
    rows = {r["strategy"]: r for r in memory_rows(SPEC, K)}
    assert rows["stage"]["state_bytes_steady"] == SPEC.row_bytes == 2 * (H * N * P * 4 + (W - 1) * CONV * 4)
    assert rows["replay"]["state_bytes_window"] == SPEC.row_bytes + (K + 1) * SPEC.token_input_bytes
    assert SPEC != RecurrentSpec(2, H, N, P, CONV, W) and SPEC == RecurrentSpec(2, H, N, P, CONV, W,
                                                                                recurrence=Mamba2Recurrence())
    with pytest.raises(TypeError, match="recurrence"):
        RecurrentSpec(2, H, N, P, CONV, W, recurrence="mamba2")
    policy = STATE_POLICIES["stage"](RecurrentStateStore(SPEC, 1))
    c = selective_scan_inputs(2, H, N, P, CONV, W)
    policy.begin(Window.from_counts([2], [0], torch.arange(2)), [0])
    policy.conv(0, c["conv_in"], c["weight"])
    with pytest.raises(ValueError, match="option A"):
        policy.recur(0, *(c[n] for n in ROW_INPUTS))
    with pytest.raises(ValueError, match="B expected"):
        policy.recur(0, c["x"], c["dt"], c["B"][:, :, :2], c["C"], A=c["A"])
    with pytest.raises(ValueError, match="4 per-row inputs"):
        policy.recur(0, c["x"], c["dt"], A=c["A"])
    with pytest.raises(ValueError, match="not scale"):
        policy.recur(0, *(c[n] for n in ROW_INPUTS), A=c["A"], scale=1.0)


# (rows, drafts, slots, accepted) per window: prefills, then verify windows that reject some drafts,
# a request without drafts beside speculative ones
WINDOWS = [([5, 3, 2], [0, 0, 0], [2, 0, 1], [0, 0, 0]),
           ([4, 4, 1], [3, 3, 0], [2, 0, 1], [1, 3, 0]),
           ([4, 4, 4], [3, 3, 3], [2, 0, 1], [0, 2, 3])]


def layer_inputs(num_rows, window, layer):
    return selective_scan_inputs(num_rows, H, N, P, CONV, W, seed=window * 10 + layer)


def run_window(policy, i, device_layout=False):
    """Window i through the lifecycle: begin, conv + recur per layer, commit with the acceptance.
    device_layout: rows as device data, plus two junk padding rows and a padding request (slot 3)."""
    rows, drafts, slots, accepted = WINDOWS[i]
    pad = 2 if device_layout else 0
    window = Window.from_counts(rows + [pad] * bool(pad), drafts + [0] * bool(pad), torch.arange(sum(rows) + pad))
    if device_layout:
        qsl = torch.tensor([0] + rows).cumsum(0)
        policy.begin(window, torch.tensor(slots + [3]), query_start_loc=torch.cat([qsl, qsl[-1:]]),
                     num_drafts=torch.tensor(drafts + [0]), max_query_len=max(rows))
        accepted = accepted + [0]
    else:
        policy.begin(window, slots)
    for layer in range(SPEC.num_layers):
        c, junk = layer_inputs(sum(rows), i, layer), selective_scan_inputs(pad, H, N, P, CONV, W, seed=99)
        cat = {n: torch.cat([c[n], junk[n]]) for n in ("conv_in",) + ROW_INPUTS}
        policy.conv(layer, cat["conv_in"], c["weight"])
        policy.recur(layer, *(cat[n] for n in ROW_INPUTS), A=c["A"], D=c["D"])
    policy.commit(Acceptance.from_accepted_len(window, accepted) if sum(drafts) else None)


def committed_only():
    """The oracle: each slot's (state [L, H, N, P], conv state [L, W-1, C]) after running only its
    committed rows, one row at a time, from the start."""
    state, conv = {}, {}
    for i, (rows, drafts, slots, accepted) in enumerate(WINDOWS):
        start = 0
        for s, d, slot, a in zip(rows, drafts, slots, accepted):
            for layer in range(SPEC.num_layers):
                c = layer_inputs(sum(rows), i, layer)
                st = state.get((layer, slot), torch.zeros(H, N, P))
                cv = conv.get((layer, slot), torch.zeros(W - 1, CONV))
                for t in range(start, start + s - d + a):
                    st = selective_scan_reference(*(c[n][t:t + 1] for n in ("x", "dt")), c["A"],
                                                  *(c[n][t:t + 1] for n in ("B", "C")), c["D"], st)[1][0]
                    cv = causal_conv_reference(c["conv_in"][t:t + 1], c["weight"], cv)[1][-(W - 1):]
                state[layer, slot], conv[layer, slot] = st, cv
            start += s
    layers = range(SPEC.num_layers)
    return [torch.stack([table[l, slot] for l in layers]) for slot in range(3) for table in (state, conv)]


@pytest.mark.parametrize("name", sorted(STATE_POLICIES))
def test_every_strategy_commits_exactly_the_committed_rows(name):
    """Every registered strategy over the Mamba2 store: after the last commit the store holds, bit for
    bit, the state of the committed tokens only (`off`, which keeps rejected drafts, must differ);
    the device layout (rows as device data, junk padding rows run as dt = 0) ends the same."""
    cls = STATE_POLICIES[name]
    stores = []
    for device_layout in (False, True):
        store = RecurrentStateStore(SPEC, 4, cls.rows_per_slot(K), scratch_slot=3)
        policy = cls(store)
        scratch = [t.clone() for t in store.committed(3)]
        for i in range(len(WINDOWS)):
            run_window(policy, i, device_layout)
        assert all(torch.equal(a, b) for a, b in zip(scratch, store.committed(3)))
        stores.append([t.clone() for slot in range(3) for t in store.committed(slot)])
    assert all(torch.equal(a, b) for a, b in zip(*stores)), name
    same = all(torch.equal(a, b) for a, b in zip(stores[0], committed_only()))
    assert same == cls.commits_accepted_only, name
