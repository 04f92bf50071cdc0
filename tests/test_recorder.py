"""The Recorder turns a window's phase events into frames whose slot states match the cache bits.

Until the policies emit `PhaseEvent`s themselves (nwor_lab.policies.observer), `drive_by_hand`
runs a real policy and sends hand-made events at the contract's points; the declared flags below
are test data, as each policy will declare them.
"""
from types import SimpleNamespace

import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.policies import make_policy
from nwor_lab.viz import Recorder, SlotState, demo_cache, demo_window, layer_states

S = SlotState
# (window_in_buffer, preserves_rejected_slots) as each policy declares them
DECLARED = {"off": (False, False), "cow": (False, True), "stage": (True, True)}


def drive_by_hand(mode, recorder, seed=0, *, declare=None, cache=None, num_reqs=3, k=3, pad_tokens=0):
    """Run one demo window through the real `mode` policy, emitting contract events by hand.
    declare: the (window_in_buffer, preserves_rejected_slots) the proxy claims (default: true ones).
    Returns (cache, demo, before) with `before` a snapshot taken at "begin"."""
    cache = cache or demo_cache()
    demo = demo_window(cache, seed, num_reqs=num_reqs, k=k, pad_tokens=pad_tokens)
    policy = make_policy(LabConfig(nwor_mode=mode), cache)
    in_buffer, preserves = declare or DECLARED[mode]
    proxy = SimpleNamespace(name=mode, cache=cache, window_in_buffer=in_buffer,
                            preserves_rejected_slots=preserves)
    layers = range(cache.num_layers)

    def emit(phase, **fields):
        event = dict(phase=phase, kind="verify", policy=proxy, window=demo.window, layers=layers, layer=None,
                     rows=None, acceptance=None, record=None, logged_slots=None)
        event.update(fields)
        recorder.on_phase(SimpleNamespace(**event))

    policy.begin(demo.window)
    before = cache.snapshot()
    emit("begin", logged_slots=demo.window.draft_slots if mode == "cow" else None)
    t = demo.window.num_tokens
    for layer in layers:
        policy.write(layer, demo.key[layer], demo.value[layer])
        emit("write", layer=layer, rows=range(0, t))
    emit("acceptance", acceptance=demo.acceptance)
    record = policy.commit(demo.acceptance)
    emit("commit", acceptance=demo.acceptance, record=record)
    return cache, demo, before


def window_slots(demo):
    """(kept slots, rejected draft slots) of the demo window, non-padding."""
    w, kept = demo.window, demo.acceptance.commit_mask
    s = w.slot_mapping
    return s[kept & (s >= 0)].tolist(), s[~kept & (s >= 0)].tolist()


def states_at(frame, slots, layer=0):
    flat = frame.grid(layer).reshape(-1)
    return {int(flat[s]) for s in slots}


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_phases_and_final_states(mode):
    rec = Recorder()
    cache, demo, before = drive_by_hand(mode, rec, seed=1)
    assert [f.phase for f in rec.frames] == ["begin", "write", "write", "acceptance", "commit"]
    assert all(f.caption.startswith(f"{mode}: ") for f in rec.frames)
    assert len({f.caption for f in rec.frames}) == 5
    kept, rejected = window_slots(demo)
    assert kept and rejected, "seed 1 must give kept and rejected drafts"
    final = rec.frames[-1]
    assert states_at(final, kept) == {S.COMMITTED}
    expected_rejected = {"off": S.REJECTED, "cow": S.RESTORED, "stage": S.EMPTY}[mode]
    assert states_at(final, rejected) == {expected_rejected}
    # the recorder's picture equals the one computed from the cache before/after the window
    in_buffer, preserves = DECLARED[mode]
    for layer in range(cache.num_layers):
        truth = layer_states(before, cache, demo.window, demo.acceptance, layer=layer,
                             window_in_buffer=in_buffer, preserves_rejected_slots=preserves)
        assert torch.equal(final.grid(layer), truth)


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_states_during_the_window(mode):
    rec = Recorder()
    cache, demo, _ = drive_by_hand(mode, rec, seed=1)
    begin, write0, write1, acceptance, _ = rec.frames
    w = demo.window
    slots = w.slot_mapping[w.slot_mapping >= 0].tolist()
    drafts = w.draft_slots[w.draft_slots >= 0].tolist()
    non_drafts = sorted(set(slots) - set(drafts))
    # begin: only CoW saved something; the committed prefix shows as COMMITTED
    assert states_at(begin, drafts) == ({S.LOGGED} if mode == "cow" else {S.EMPTY})
    prefix = [s for s in range(cache.num_slots) if s not in slots and begin.grid().reshape(-1)[s] != S.EMPTY]
    assert len(prefix) == sum(demo.prefix_len)
    # write of layer 0: layer 0 rows written (stage: in its buffer, the cache slots as they were), layer 1 not yet
    if mode == "stage":
        assert torch.equal(write0.grid(0), begin.grid(0)) and torch.equal(write1.grid(1), begin.grid(1))
        assert set(write0.staging[0].tolist()) == {S.STAGED}
    else:
        assert states_at(write0, slots, layer=0) == {S.WRITTEN}
        assert states_at(write1, slots, layer=1) == {S.WRITTEN}
    assert states_at(write0, non_drafts, layer=1) == {S.EMPTY}
    # acceptance: nothing moved yet, the labels carry the verdict
    assert torch.equal(acceptance.grid(0), write1.grid(0))
    _, rejected = window_slots(demo)
    assert all(acceptance.labels[s].endswith("rejected") and acceptance.marks[s].endswith("✗") for s in rejected)
    assert acceptance.acceptance is not None and write1.acceptance is None


def test_bits_overrule_a_false_declaration():
    """A policy that claims to preserve rejected slots but leaves them written is drawn REJECTED."""
    rec = Recorder()
    cache, demo, _ = drive_by_hand("off", rec, seed=1, declare=(False, True))
    _, rejected = window_slots(demo)
    assert states_at(rec.frames[-1], rejected) == {S.REJECTED}
    assert "WARNING" in rec.frames[-1].caption and "WARNING" not in rec.frames[-2].caption


def test_leftovers_carry_into_the_next_window():
    """off leaves rejected K/V behind; the next window's "before" shows them (cow restores them)."""
    for mode, left in (("off", S.REJECTED), ("cow", S.EMPTY)):
        rec = Recorder(layers=[1])
        cache, demo, _ = drive_by_hand(mode, rec, seed=1, num_reqs=1)
        _, rejected = window_slots(demo)
        drive_by_hand(mode, rec, seed=2, num_reqs=1, cache=cache)
        second_begin = [f for f in rec.frames if f.window_index == 1][0]
        assert second_begin.phase == "begin" and second_begin.layers == [1]
        untouched = set(rejected) - set(second_begin.window.slot_mapping.tolist())
        assert untouched, "seed 2 must leave some of window 0's rejected slots alone"
        assert states_at(second_begin, untouched, layer=1) == {left}


def test_filters_and_padding():
    rec = Recorder(kinds=("draft",))
    drive_by_hand("off", rec, seed=0)
    assert rec.frames == []
    rec = Recorder(max_windows=1)
    cache, demo, _ = drive_by_hand("stage", rec, seed=0, pad_tokens=2)
    drive_by_hand("stage", rec, seed=3, cache=cache)
    assert {f.window_index for f in rec.frames} == {0}
    assert (demo.window.slot_mapping == -1).sum() == 2 and rec.frames[-1].window.num_tokens == demo.window.num_tokens


def test_demo_frames_through_the_policy_observer_api():
    pytest.importorskip("nwor_lab.policies.observer")
    from nwor_lab.viz import demo_frames, demo_frames_by_mode
    by_mode = demo_frames_by_mode(seed=1, windows=1, reused_block=False)
    assert set(by_mode) >= {"off", "cow", "stage"}
    for mode, frames in by_mode.items():
        assert [f.phase for f in frames] == ["begin", "write", "write", "acceptance", "commit"]
        hand = Recorder()
        drive_by_hand(mode, hand, seed=1)
        for a, b in zip(frames, hand.frames):          # the policy's events == the hand-made ones
            assert a.caption == b.caption
            # the demo names its prefixes committed; the hand recorder found them as old bits
            assert all(torch.equal(a.states[l], b.states[l].masked_fill(b.states[l] == S.OLD, S.COMMITTED))
                       for l in a.states)
    assert demo_frames("cow", seed=1, layers=[1])[0].layers == [1]


def test_bits_before_the_recording_are_old_unless_named_committed():
    """A freed block's bits (no running request's kept token) are OLD; a rejected draft over them
    stays OLD under stage, is RESTORED to them under cow, turns REJECTED under off."""
    for mode, left in (("off", S.REJECTED), ("cow", S.RESTORED), ("stage", S.OLD)):
        cache = demo_cache()
        cache.key.normal_(), cache.value.normal_()          # every slot holds someone's old bits
        rec = Recorder()
        _, demo, _ = drive_by_hand(mode, rec, seed=1, cache=cache)
        kept, rejected = window_slots(demo)
        assert states_at(rec.frames[0], kept + rejected) == ({S.OLD, S.LOGGED} if mode == "cow" else {S.OLD})
        assert states_at(rec.frames[-1], kept) == {S.COMMITTED} and states_at(rec.frames[-1], rejected) == {left}
    named = Recorder(committed=range(4))
    drive_by_hand("stage", named, seed=1, cache=cache)
    assert states_at(named.frames[0], range(4)) == {S.COMMITTED}


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_buffers_hold_what_the_policy_holds(mode):
    """The staging buffer (stage) and the CoW log (cow), per window row and layer, phase by phase."""
    rec = Recorder()
    _, demo, _ = drive_by_hand(mode, rec, seed=1)
    begin, write0, write1, acceptance, commit = rec.frames
    w = demo.window
    kept = demo.acceptance.commit_mask
    draft = w.token_draft_pos > 0
    if mode != "stage":
        assert all(not f.staging for f in rec.frames)
    else:
        assert set(begin.staging[0].tolist()) == {S.EMPTY}
        assert set(write0.staging[0].tolist()) == {S.STAGED} and set(write0.staging[1].tolist()) == {S.EMPTY}
        assert set(write1.staging[1].tolist()) == {S.STAGED}
        assert torch.equal(acceptance.staging[1], write1.staging[1])           # nothing moves at acceptance
        assert set(commit.staging[0][kept].tolist()) == {S.COMMITTED}          # copied into the cache
        assert set(commit.staging[0][~kept].tolist()) == {S.EMPTY}             # dropped, never in the cache
    if mode != "cow":
        assert all(not f.log for f in rec.frames)
    else:
        real = draft & (w.slot_mapping >= 0)
        assert set(begin.log[0][real].tolist()) == {S.LOGGED} and set(begin.log[1][~real].tolist()) == {S.EMPTY}
        assert set(commit.log[0][real & ~kept].tolist()) == {S.RESTORED}       # copied back
        assert set(commit.log[0][real & kept].tolist()) == {S.EMPTY}           # dropped: the draft was kept


def test_demo_has_two_windows_the_second_after_the_first():
    from nwor_lab.viz import demo_frames
    from nwor_lab.viz.demo import demo_windows
    demos = demo_windows(demo_cache(), seed=0)
    first, second = demos
    kept_per_req = [1 + a if n else s for n, a, s in zip(first.window.num_draft_tokens,
                                                        first.acceptance.accepted_len.tolist(),
                                                        first.window.num_scheduled_tokens)]
    assert second.prefix_len == [p + n for p, n in zip(first.prefix_len, kept_per_req)]
    assert torch.equal(demo_windows(demo_cache(), seed=0, num_windows=1)[0].key, first.key)   # same first window
    frames = demo_frames("off", seed=0)
    assert [f.window_index for f in frames] == [0] * 5 + [1] * 5
    # under off the second window writes over slots the first one's rejected drafts dirtied
    rejected0 = set(window_slots(first)[1])
    assert rejected0 & set(second.window.slot_mapping.tolist())
    old = [s for s in range(demo_cache().num_slots) if frames[0].grid().reshape(-1)[s] == S.OLD]
    assert old, "the reused block's bits start OLD"


def test_engine_run_recorded_no_rejected_kv_under_nwor():
    """The engine's windows (verify and EAGLE draft chain) through each policy: only `off` ever
    leaves rejected K/V in the cache; every mode emits the same tokens."""
    from nwor_lab.model.toy import toy_pair
    from nwor_lab.viz import acceptance_by_position
    from nwor_lab.viz.demo import record_generate
    target, head = toy_pair(0, noise=0.2)
    left, tokens = {}, {}
    for mode in ("off", "cow", "stage"):
        frames, out = record_generate([[1, 2, 3, 4, 5], [7, 3]], mode, max_new_tokens=6, k=3, max_windows=6,
                                      target=target, head=head)
        commits = [f for f in frames if f.phase == "commit"]
        assert {f.kind for f in commits} == {"verify", "draft"} and len(commits) == 6
        assert sum(f.record.num_drafts - f.record.num_accepted for f in commits) > 0
        left[mode] = sum(int((g == S.REJECTED).sum()) for f in commits for g in f.states.values())
        tokens[mode] = out.token_ids
        acceptance_by_position(out.trace).to_json()
    assert left["off"] > 0 and left["cow"] == 0 and left["stage"] == 0
    assert tokens["off"] == tokens["cow"] == tokens["stage"]
