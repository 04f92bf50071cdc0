"""State checkpoints at block boundaries (nwor_lab.state.checkpoints) under every state strategy that
commits accepted rows only: after each window, the checkpoint of every block whose last row was
committed is bit for bit the state of decoding only the committed rows up to that row, and a block
whose last row was a rejected draft gets nothing (host groups and the device layout alike)."""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.ops.gated_delta import causal_conv_reference, gated_delta_recurrent_reference
from nwor_lab.state import STATE_POLICIES, make_state_policy, make_state_store
from nwor_lab.state.checkpoints import BlockStates
from nwor_lab.window import Window
from test_state import NAMES, SPEC, WINDOWS, feed_and_commit

BS = 2


def block_of(slot: int, pos: int) -> int:
    return slot * 16 + pos // BS


def exact_modes():
    return sorted(m for m, cls in STATE_POLICIES.items() if cls.commits_accepted_only)


@pytest.mark.parametrize("device_layout", [False, True])
@pytest.mark.parametrize("mode", exact_modes())
def test_checkpoints_hold_committed_rows_only(mode, device_layout):
    config = LabConfig(state_mode=mode)
    policy = make_state_policy(config, make_state_store(config, SPEC, 4, 3))
    tap = policy.block_states = BlockStates(SPEC, 64, BS)
    pos, state, conv = {}, {}, {}
    expected, rejected_ends = {}, set()
    for i, (rows, drafts, slots, accepted) in enumerate(WINDOWS):
        slot_mapping = torch.tensor([block_of(s, pos.get(s, 0) + j) * BS + (pos.get(s, 0) + j) % BS
                                     for s, n in zip(slots, rows) for j in range(n)])
        window = Window.from_counts(rows, drafts, slot_mapping)
        if device_layout and max(rows) <= 16:
            qsl = torch.tensor([0] + rows).cumsum(0)
            policy.begin(window, torch.tensor(slots), query_start_loc=qsl, num_drafts=torch.tensor(drafts),
                         max_query_len=max(rows))
        else:
            policy.begin(window, slots)
        fed = feed_and_commit(policy, window, accepted, seed=i)
        start = 0
        for s, d, slot, a in zip(rows, drafts, slots, accepted):      # the oracle: committed rows one by one
            p0 = pos.get(slot, 0)
            for j in range(s):
                p = p0 + j
                if j > s - d - 1 + a:
                    if p % BS == BS - 1:
                        rejected_ends.add(block_of(slot, p))
                    continue
                for layer, c in enumerate(fed):
                    t = start + j
                    st = state.get((layer, slot), torch.zeros(SPEC.num_heads, SPEC.head_k_dim, SPEC.head_v_dim))
                    cv = conv.get((layer, slot), torch.zeros(SPEC.conv_width - 1, SPEC.conv_dim))
                    state[layer, slot] = gated_delta_recurrent_reference(*(c[n][t:t + 1] for n in NAMES), st)[1][0]
                    history = causal_conv_reference(c["x"][t:t + 1], c["weight"], cv)[1]
                    conv[layer, slot] = history[-(SPEC.conv_width - 1):]
                if p % BS == BS - 1:
                    expected[block_of(slot, p)] = [(state[l, slot].clone(), conv[l, slot].clone())
                                                   for l in range(SPEC.num_layers)]
            pos[slot] = p0 + s - d + a
            start += s
    assert expected and rejected_ends - set(expected)           # windows both committed and rejected block ends
    for b, layers in expected.items():
        for l, (st, cv) in enumerate(layers):
            assert torch.equal(tap.recurrent[l, b], st), (mode, b, l)
            assert torch.equal(tap.conv[l, b], cv), (mode, b, l)
    for b in rejected_ends - set(expected):                     # a rejected draft's state reached no checkpoint
        assert not tap.recurrent[:, b].any() and not tap.conv[:, b].any(), (mode, b)
