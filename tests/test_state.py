"""Every state strategy but `off` leaves the store equal, bit for bit, to decoding only the accepted
rows one by one; `off` keeps the rejected drafts' updates. Op level: the conv and the recurrence fed
the same rows (nwor_lab.state); the model level is tests/test_hybrid.py."""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.ops.gated_delta import causal_conv_reference, gated_delta_recurrent_reference
from nwor_lab.ops.generators import gated_delta_inputs
from nwor_lab.state import (STATE_POLICIES, RecurrentSpec, StateWindowError, make_state_policy,
                            make_state_store, state_policy_class)
from nwor_lab.window import Acceptance, Window

SPEC = RecurrentSpec(num_layers=2, num_heads=2, head_k_dim=8, head_v_dim=6, conv_dim=12, conv_width=4)
K = 3
NAMES = ("q", "k", "v", "g", "beta")


def run_window(policy, rows, drafts, slots, accepted, seed):
    """One window over every layer; -> the per-request inputs of each layer (for the oracle)."""
    window = Window.from_counts(rows, drafts, torch.arange(sum(rows)))
    policy.begin(window, slots)
    return window, feed_and_commit(policy, window, accepted, seed)


def feed_and_commit(policy, window, accepted, seed):
    """A begun window: every layer's conv and recurrence fed random rows (seeded by `seed` and the
    layer), then the commit of `accepted`; -> the inputs of each layer."""
    fed = []
    for layer in range(SPEC.num_layers):
        c = gated_delta_inputs(window.num_tokens, SPEC.num_heads, SPEC.head_k_dim, SPEC.head_v_dim, SPEC.conv_dim,
                               SPEC.conv_width, seed=seed * 10 + layer)
        policy.conv(layer, c["x"], c["weight"])
        policy.recur(layer, *(c[n] for n in NAMES))
        fed.append(c)
    policy.commit(Acceptance.from_accepted_len(window, accepted) if window.num_drafts else None)
    return fed


class Oracle:
    """Sequential decoding of only the committed rows, one row per step, per slot and layer."""

    def __init__(self):
        self.state, self.conv = {}, {}

    def feed(self, fed, rows, drafts, slots, accepted):
        start = 0
        for s, d, slot, a in zip(rows, drafts, slots, accepted):
            for layer, c in enumerate(fed):
                st = self.state.get((layer, slot), torch.zeros(SPEC.num_heads, SPEC.head_k_dim, SPEC.head_v_dim))
                cv = self.conv.get((layer, slot), torch.zeros(SPEC.conv_width - 1, SPEC.conv_dim))
                for t in range(start, start + s - d + a):
                    st = gated_delta_recurrent_reference(*(c[n][t:t + 1] for n in NAMES), st)[1][0]
                    cv = causal_conv_reference(c["x"][t:t + 1], c["weight"], cv)[1][-(SPEC.conv_width - 1):]
                self.state[layer, slot], self.conv[layer, slot] = st, cv
            start += s


# (rows, drafts, slots, accepted) per window: prefills, then verify windows with every acceptance,
# a request without drafts beside speculative ones, and slots in another order
WINDOWS = [([5, 3, 2], [0, 0, 0], [2, 0, 1], [0, 0, 0]),
           ([4, 4, 1], [3, 3, 0], [2, 0, 1], [1, 3, 0]),
           ([4, 4, 4], [3, 3, 3], [2, 0, 1], [0, 2, 3]),
           ([3, 4], [2, 3], [0, 2], [2, 0])]


@pytest.mark.parametrize("mode", sorted(STATE_POLICIES))
def test_store_equals_decoding_only_the_accepted_rows(mode):
    config = LabConfig(state_mode=mode)
    policy = make_state_policy(config, make_state_store(config, SPEC, num_slots=3, k=K))
    oracle = Oracle()
    differs = False
    for i, (rows, drafts, slots, accepted) in enumerate(WINDOWS):
        _, fed = run_window(policy, rows, drafts, slots, accepted, seed=i)
        oracle.feed(fed, rows, drafts, slots, accepted)
        for layer in range(SPEC.num_layers):
            for slot in range(3):
                state, conv = policy.store.committed(slot, layer)
                same = torch.equal(state, oracle.state[layer, slot]) and torch.equal(conv, oracle.conv[layer, slot])
                if policy.commits_accepted_only:
                    assert same, f"{mode}: window {i}, layer {layer}, slot {slot}"
                differs |= not same
        # an off store, once wrong, stays on its own path: feed the oracle its state to find the
        # next window's own difference too
        if not policy.commits_accepted_only:
            for layer in range(SPEC.num_layers):
                for slot in range(3):
                    oracle.state[layer, slot], oracle.conv[layer, slot] = (
                        t.clone() for t in policy.store.committed(slot, layer))
    assert differs == (not policy.commits_accepted_only)


def test_memory_declarations():
    spec = SPEC
    row = spec.row_bytes
    assert row == 2 * (2 * 8 * 6 * 4 + 3 * 12 * 4)
    steady = {m: STATE_POLICIES[m].steady_bytes_per_request(K, spec) for m in STATE_POLICIES}
    transient = {m: STATE_POLICIES[m].transient_bytes_per_request(K, spec) for m in STATE_POLICIES}
    assert steady["snapshots"] == (K + 1) * row and all(steady[m] == row for m in steady if m != "snapshots")
    assert transient["off"] == transient["snapshots"] == 0
    assert transient["replay"] < transient["cow"]                    # cow adds the checkpoint
    assert transient["stage"] >= K * row                             # k+1 states while the window is open
    store = make_state_store(LabConfig(state_mode="snapshots"), spec, 4, K)
    assert store.nbytes == 4 * steady["snapshots"]


def test_kept_bytes_are_what_the_strategy_declares():
    """The peak of what cow / replay / stage held during a window of one request with k drafts is
    within their declared transient bytes."""
    for mode in ("cow", "replay", "stage"):
        config = LabConfig(state_mode=mode)
        policy = make_state_policy(config, make_state_store(config, SPEC, 1, K))
        run_window(policy, [K + 1], [K], [0], [1], seed=9)
        declared = policy.transient_bytes_per_request(K, SPEC)
        assert declared // 2 < policy.stats["bytes_kept_peak"] <= declared, mode


def test_auto_is_the_write_policys_declared_counterpart():
    from nwor_lab.engine.choices import Choices
    assert state_policy_class(Choices.of(LabConfig(nwor_mode="stage")).state_config()).name == "stage"
    assert state_policy_class(Choices.of(LabConfig(nwor_mode="cow")).state_config()).name == "cow"
    assert state_policy_class(LabConfig(nwor_mode="cow", state_mode="replay")).name == "replay"
    with pytest.raises(ValueError, match="only the engine resolves"):     # the state package never guesses by name
        state_policy_class(LabConfig(nwor_mode="stage"))
    assert LabConfig.from_env(environ={"NWOR_LAB_STATE_MODE": "snapshots"}).state_mode == "snapshots"
    with pytest.raises(ValueError, match="state_mode"):
        LabConfig(state_mode="mamba")


def test_cancel_leaves_the_store_as_off():
    stores = {}
    for mode in ("off", "stage", "replay", "cow", "snapshots"):
        config = LabConfig(state_mode=mode)
        policy = make_state_policy(config, make_state_store(config, SPEC, 2, K))
        run_window(policy, [3, 2], [0, 0], [0, 1], [0, 0], seed=1)
        window = Window.from_counts([4, 4], [3, 3], torch.arange(8))
        policy.begin(window, [0, 1])
        for layer in range(SPEC.num_layers):
            c = gated_delta_inputs(8, SPEC.num_heads, SPEC.head_k_dim, SPEC.head_v_dim, SPEC.conv_dim, seed=layer)
            policy.conv(layer, c["x"], c["weight"])
            policy.recur(layer, *(c[n] for n in NAMES))
        policy.cancel()
        stores[mode] = [t.clone() for s in (0, 1) for t in policy.store.committed(s)]
    for mode in stores:
        assert all(torch.equal(a, b) for a, b in zip(stores[mode], stores["off"])), mode


def test_lifecycle_errors():
    config = LabConfig(state_mode="stage")
    policy = make_state_policy(config, make_state_store(config, SPEC, 2, K))
    window = Window.from_counts([2], [1], torch.arange(2))
    with pytest.raises(StateWindowError, match="no window"):
        policy.commit()
    with pytest.raises(ValueError, match="slots"):
        policy.begin(window, [0, 1])
    policy.begin(window, [1])
    c = gated_delta_inputs(2, SPEC.num_heads, SPEC.head_k_dim, SPEC.head_v_dim, SPEC.conv_dim)
    policy.conv(0, c["x"], c["weight"])
    with pytest.raises(StateWindowError, match="already advanced"):
        policy.conv(0, c["x"], c["weight"])
    with pytest.raises(StateWindowError, match="not advanced"):
        policy.commit(Acceptance.from_accepted_len(window, [1]))
    with pytest.raises(ValueError, match="expected"):
        policy.recur(0, *(c[n][:1] for n in NAMES))
    policy.cancel()
    snap = LabConfig(state_mode="snapshots")
    small = make_state_policy(snap, make_state_store(snap, SPEC, 1, k=1))
    with pytest.raises(ValueError, match="rows per slot"):
        small.begin(Window.from_counts([4], [3], torch.arange(4)), [0])


def test_memory_rows_on_the_qwen3_next_shape():
    """stage holds 1/(k+1) of snapshots' steady memory; every strategy's window peak is listed."""
    from nwor_lab.state import memory_rows, qwen3_next_spec
    spec = qwen3_next_spec()
    rows = {r["strategy"]: r for r in memory_rows(spec, 4)}
    assert spec.state_bytes_layer == 32 * 128 * 128 * 4 and spec.conv_dim == 8192
    assert rows["stage"]["state_bytes_steady"] * 5 == rows["snapshots"]["state_bytes_steady"]
    assert all(r["state_bytes_window"] >= r["state_bytes_steady"] for r in rows.values())
    assert rows["replay"]["state_bytes_window"] < rows["stage"]["state_bytes_window"]


def test_cow_as_captured_restores_every_request_and_stays_exact(monkeypatch):
    """Inside a CUDA-graph capture cow cannot learn on the host which requests took every draft: it
    restores and re-advances all of them, the rejected rows masked to identity (g = 0, beta = 0).
    The store is bit-identical to the eager path's."""
    import nwor_lab.state.cow as cow
    stores = []
    for captured in (False, True):
        monkeypatch.setattr(cow, "capturing", lambda: captured)
        config = LabConfig(state_mode="cow", validate=not captured)
        policy = make_state_policy(config, make_state_store(config, SPEC, 3, K))
        for i, (rows, drafts, slots, accepted) in enumerate(WINDOWS):
            run_window(policy, rows, drafts, slots, accepted, seed=i)
        assert policy.stats["rows_recomputed"] > 0
        stores.append([t.clone() for s in range(3) for t in policy.store.committed(s)])
    assert all(torch.equal(a, b) for a, b in zip(*stores))


def test_masked_rows_leave_the_state_bit_for_bit():
    """The identity a fixed-shape recompute relies on: a row with g = 0 and beta = 0 changes nothing."""
    c = gated_delta_inputs(5, seed=2)
    g, beta = c["g"].clone(), c["beta"].clone()
    g[3:], beta[3:] = 0, 0
    _, masked = gated_delta_recurrent_reference(c["q"], c["k"], c["v"], g, beta, c["state"])
    _, prefix = gated_delta_recurrent_reference(*(c[n][:3] for n in NAMES), c["state"])
    assert torch.equal(masked[-1], prefix[-1])


def test_state_window_bench_rows():
    """`python -m nwor_lab.bench.state_window` at the tiny shape: one row per strategy and batch, the
    window's real peak within each strategy's declaration (timings are printed, never asserted)."""
    from nwor_lab.bench.state_window import main
    doc = main(["--shape", "tiny", "--batch", "2", "--k", str(K), "--reps", "1", "--json", "--device", "cpu"])
    assert doc["backend"] == "torch" and doc["device"] == "cpu"
    rows = {r["strategy"]: r for r in doc["rows"]}
    assert set(rows) == set(STATE_POLICIES)
    for name, r in rows.items():
        assert r["bytes_kept_peak_per_request"] <= r["state_bytes_window"] - r["state_bytes_steady"], name
        assert r["window_ms"] >= r["commit_ms"] >= 0
    assert rows["replay"]["rows_recomputed_per_window"] == 3 * 2 * (K + 1)   # layers x requests x (k+1)
    assert rows["stage"]["rows_recomputed_per_window"] == rows["snapshots"]["rows_recomputed_per_window"] == 0


def run_window_device_layout(policy, rows, drafts, slots, accepted, seed, scratch, host_lists=False):
    """run_window through the device layout a captured step keeps: the same requests, then two
    padding rows in no request's range and a padding request with no rows (at the scratch slot).
    host_lists: the same layout as host lists (an eager step's true counts)."""
    pad_rows = 2
    window = Window.from_counts(rows + [pad_rows], drafts + [0], torch.arange(sum(rows) + pad_rows))
    qsl = torch.tensor([0] + rows).cumsum(0)
    qsl = torch.cat([qsl, qsl[-1:]])                               # the padding request: no rows
    if host_lists:
        policy.begin(window, slots + [scratch], query_start_loc=qsl.tolist(), num_drafts=drafts + [0])
    else:
        policy.begin(window, torch.tensor(slots + [scratch]), query_start_loc=qsl,
                     num_drafts=torch.tensor(drafts + [0]), max_query_len=max(rows))
    for layer in range(SPEC.num_layers):
        c = gated_delta_inputs(sum(rows), SPEC.num_heads, SPEC.head_k_dim, SPEC.head_v_dim, SPEC.conv_dim,
                               SPEC.conv_width, seed=seed * 10 + layer)
        junk = gated_delta_inputs(pad_rows, SPEC.num_heads, SPEC.head_k_dim, SPEC.head_v_dim, SPEC.conv_dim,
                                  SPEC.conv_width, seed=999)
        cat = {n: torch.cat([c[n], junk[n]]) for n in ("x",) + NAMES}
        y = policy.conv(layer, cat["x"], c["weight"])
        o = policy.recur(layer, *(cat[n] for n in NAMES))
        assert y.shape[0] == o.shape[0] == sum(rows) + pad_rows
    policy.commit(Acceptance.from_accepted_len(window, accepted + [0]))


@pytest.mark.parametrize("mode", sorted(STATE_POLICIES))
def test_device_layout_equals_the_host_groups(mode):
    """Rows per request as device data (query_start_loc, num_drafts, a bound Q), with padding rows
    and a padding request: the store ends bit-identical to the host-grouped run, and the scratch
    slot of the padding request is left as it was."""
    stores = []
    for device_layout in (False, True, "host lists"):
        config = LabConfig(state_mode=mode)
        policy = make_state_policy(config, make_state_store(config, SPEC, 4, K))
        scratch_before = [t.clone() for t in policy.store.committed(3)]
        for i, (rows, drafts, slots, accepted) in enumerate(WINDOWS):
            if device_layout and max(rows) <= 16:
                run_window_device_layout(policy, rows, drafts, slots, accepted, seed=i, scratch=3,
                                         host_lists=device_layout == "host lists")
            else:
                run_window(policy, rows, drafts, slots, accepted, seed=i)
        stores.append([t.clone() for s in range(3) for t in policy.store.committed(s)])
        if device_layout:
            assert all(torch.equal(a, b) for a, b in zip(scratch_before, policy.store.committed(3)))
    for other in stores[1:]:
        assert all(torch.equal(a, b) for a, b in zip(stores[0], other)), mode


def test_only_the_store_s_scratch_slot_may_repeat_in_a_window():
    """A padded step puts every padding request on the scratch slot; a request's slot twice is a bug."""
    config = LabConfig(state_mode="stage")
    store = make_state_store(config, SPEC, 4, K, scratch_slot=3)
    policy = make_state_policy(config, store)
    window = Window.from_counts([2, 1, 1], [1, 0, 0], torch.arange(4))
    policy.begin(window, torch.tensor([0, 3, 3]))
    policy.cancel()
    with pytest.raises(ValueError, match="scratch slot, 3"):
        policy.begin(window, torch.tensor([0, 0, 3]))
    with pytest.raises(ValueError, match="scratch_slot=4"):
        make_state_store(config, SPEC, 4, K, scratch_slot=4)
