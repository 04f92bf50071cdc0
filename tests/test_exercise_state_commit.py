"""Exercise (r) state_commit (chapter 13): planted wrong answers are caught with the position they
took, in words and in a picture, and the reference commits what the `stage` state policy commits.
(That it passes, says "not attempted yet" for a stub and answers its prediction is checked for every
exercise in tests/test_exercises.py.)"""
import torch

from exercise_tools import failed
from nwor_lab import exercises
from nwor_lab.exercises import solutions


def commit_last(window_states, conv_history, num_drafts, accepted_len, conv_width):
    """What `off` keeps: the state after the last draft and the last conv inputs."""
    return solutions.state_commit(window_states, conv_history, num_drafts, num_drafts, conv_width)


def conv_one_early(window_states, conv_history, num_drafts, accepted_len, conv_width):
    """The right state, the conv inputs ending one before d_a (forgets that row W-1 is t_last's)."""
    state, _ = solutions.state_commit(window_states, conv_history, num_drafts, accepted_len, conv_width)
    rows = torch.arange(len(accepted_len))
    return state, conv_history[rows[:, None], accepted_len[:, None] + torch.arange(conv_width - 1)]


def state_one_late(window_states, conv_history, num_drafts, accepted_len, conv_width):
    """The state after d_{a+1}: counts t_last as a draft."""
    _, conv = solutions.state_commit(window_states, conv_history, num_drafts, accepted_len, conv_width)
    a = torch.minimum(accepted_len + 1, num_drafts)
    return window_states[torch.arange(len(a)), a], conv


def test_state_commit_catches_offs_choice_off_by_ones_and_float64():
    r = failed(exercises.check_state_commit(commit_last), "state_commit", "no draft accepted")
    assert "expected request 0's state after t_last, got request 0's state after d_3" in r.message
    assert r.figure.layout.shapes, "the cells that differ are outlined"
    r = failed(exercises.check_state_commit(conv_one_early), "state_commit", "every draft accepted")
    assert "conv_state of request 0, entry 0" in r.message and "got request 0's input of t_last" in r.message
    failed(exercises.check_state_commit(state_one_late), "state_commit", "no draft accepted")

    def float64(**kw):
        state, conv = solutions.state_commit(**kw)
        return state.double(), conv
    failed(exercises.check_state_commit(float64), "state_commit", "no request",
           "state: dtype float64, the spec says float32")


def test_the_reference_commits_what_the_stage_policy_commits():
    """One gated DeltaNet layer, three requests (drafts 3, 0, 2): the window's states and conv history
    computed from the committed state, then the state and conv state `state_commit` picks equal what
    `stage` leaves in the store."""
    from nwor_lab.config import LabConfig
    from nwor_lab.ops.gated_delta import causal_conv_reference, gated_delta_recurrent_reference
    from nwor_lab.ops.generators import gated_delta_inputs
    from nwor_lab.state import RecurrentSpec, make_state_policy, make_state_store
    from nwor_lab.window import Acceptance, Window

    H, K, V, C, W, k = 2, 4, 3, 6, 4, 3
    drafts, accepted = [3, 0, 2], [1, 0, 2]
    rows = [d + 1 for d in drafts]
    spec = RecurrentSpec(num_layers=1, num_heads=H, head_k_dim=K, head_v_dim=V, conv_dim=C, conv_width=W)
    config = LabConfig(state_mode="stage", backend="torch")
    store = make_state_store(config, spec, len(rows), k)
    policy = make_state_policy(config, store)
    inp = gated_delta_inputs(sum(rows), H, K, V, C, W, seed=4)
    gen = torch.Generator().manual_seed(2)
    store.recurrent.copy_(torch.randn(store.recurrent.shape, generator=gen))
    store.conv.copy_(torch.randn(store.conv.shape, generator=gen))
    before = [tuple(t.clone() for t in store.committed(r, 0)) for r in range(len(rows))]

    states = torch.full((len(rows), k + 1, H * K * V), float("nan"))
    history = torch.full((len(rows), W - 1 + k + 1, C), float("nan"))
    start = 0
    for r, n in enumerate(rows):
        sl = slice(start, start + n)
        _, kept = gated_delta_recurrent_reference(*(inp[t][sl] for t in ("q", "k", "v", "g", "beta")),
                                                  state=before[r][0], keep_from=0)
        states[r, :n] = kept.reshape(n, -1)
        _, hist = causal_conv_reference(inp["x"][sl], inp["weight"], before[r][1])
        history[r, :W - 1 + n] = hist
        start += n

    window = Window.from_counts(rows, drafts, torch.arange(sum(rows)))
    policy.begin(window, list(range(len(rows))))
    policy.conv(0, inp["x"], inp["weight"])
    policy.recur(0, *(inp[t] for t in ("q", "k", "v", "g", "beta")))
    policy.commit(Acceptance.from_accepted_len(window, accepted))

    state, conv = solutions.state_commit(states, history, torch.tensor(drafts), torch.tensor(accepted), W)
    for r in range(len(rows)):
        got_state, got_conv = store.committed(r, 0)
        assert torch.equal(got_state.reshape(-1), state[r]), r
        assert torch.equal(got_conv, conv[r]), r
