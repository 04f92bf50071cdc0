"""A pre-launched step that carries requests which finished in the step before it (dead riders):
the device computed their `remaining` as 0 (`step.next_inputs`), so their rows write nothing
(`window_chain.verify_rows`: slot -1), draft nothing and run a hybrid target's state window on the
store's scratch slot; the host leaves them out of the step's bookkeeping
(`StepRunner.pending_requests`, `StepResult(aboard=)`). Run on CPU on the padded eager path
(`StepRunner(pad=True, capture=False)`), which runs the same body and pre-launches like a graph
does; the captured replays run the same checks in tests/gpu/test_gpu_prelaunch_finish.py
(unverified here: no GPU).

Greedy tokens, every window's trace and every policy's record are the same with the pre-launch on
and off (nobody waits here, so both runs group the requests alike), for off / cow / stage, with
prefix caching (a second wave of prompts hits the blocks the first wave's finishing requests
left), with a `draft_counts` hook, at k = 0, on sliding-window rings, with forced acceptance, for a
hybrid target under every state strategy, and
through the serve driver; a dead rider's blocks, state slot and block checkpoints keep their bytes
while its step runs. At T > 0 and while a request waits, dead riders are refused (named)."""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_pair

# different lengths and budgets, so requests finish at different steps while others run on
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8], [9, 10, 1, 2, 3, 4, 5, 6], [11, 12, 13]]
MAX_NEW = [7, 12, 9, 16]


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def engine_for(pair, mode, *, k=3, prelaunch=True, prefix="", temperature=0.0, hook=None):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, prefix_cache=prefix), k=k, block_size=4,
                   max_num_seqs=4, num_blocks=128, temperature=temperature, seed=3)
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    e.runner.prelaunch = prelaunch
    e.draft_counts = hook
    return e


def wave(e, prompts=PROMPTS, max_new=MAX_NEW):
    reqs = [e.add_request(p, n) for p, n in zip(prompts, max_new)]
    e.run()
    return [r.output for r in reqs]


def trace(e):
    return [(t.step, t.kind, t.req_ids, t.accepted, t.emitted, t.record.to_dict() if t.record else None)
            for t in e.trace]


def twice(pair, mode, waves=1, **kw):
    """-> (tokens, trace, engine) with the pre-launch on, then off."""
    out = []
    for prelaunch in (True, False):
        e = engine_for(pair, mode, prelaunch=prelaunch, **kw)
        tokens = [wave(e) for _ in range(waves)]
        out.append((tokens, trace(e), e))
    return out


@pytest.mark.parametrize("prefix", ["", "on"])
@pytest.mark.parametrize("mode", NWOR_MODES)
def test_finishing_requests_ride_dead_and_tokens_traces_records_stay(pair, mode, prefix):
    (on, on_trace, e), (off, off_trace, e_off) = twice(pair, mode, waves=2 if prefix else 1, prefix=prefix)
    assert e.runner.dead_riders > 0                     # the case was taken: a finished request rode a step
    assert e_off.runner.prelaunched == 0
    assert on == off
    assert on_trace == off_trace                        # the host skipped the dead riders everywhere
    if prefix:
        assert e.prefix_stats()["hit_tokens"] > 0       # the second wave read the first wave's blocks
        assert e.prefix_stats() == e_off.prefix_stats()


def test_greedy_tokens_are_target_only_tokens(pair):
    """(The dead riders' logits never reach a token: target-only greedy decoding agrees.)"""
    e = engine_for(pair, "stage")
    spec = wave(e)
    assert e.runner.dead_riders > 0
    assert spec == wave(engine_for(pair, "stage", k=0, prelaunch=False))


@pytest.mark.parametrize("counts", ["k", "cycling"])
def test_a_draft_counts_hook_decodes_alike(pair, counts):
    """A hook asked before each step (the pre-launch asks it with the requests that may finish)."""
    def make():
        if counts == "k":                               # keeps k: every decode step may pre-launch
            return lambda eng, reqs: [eng.k] * len(reqs)
        it = iter([3, 3, 3, 2, 3, 3, 1, 3, 3, 3] * 40)
        return lambda eng, reqs: [next(it)] * len(reqs)
    got = []
    for prelaunch in (True, False):
        e = engine_for(pair, "cow", prelaunch=prelaunch, hook=make())
        got.append(wave(e))
        if prelaunch:
            assert e.runner.prelaunched > 0 and (counts != "k" or e.runner.dead_riders > 0)
    assert got[0] == got[1] == wave(engine_for(pair, "cow", prelaunch=False))


def test_target_only_decode_buckets_ride_dead_too(pair):
    (on, on_trace, e), (off, off_trace, _) = twice(pair, "off", k=0)
    assert e.runner.dead_riders > 0 and on == off and on_trace == off_trace


def watch_prelaunches(e) -> list:
    """Spy on the runner's pre-launches -> the list each one appends to: (step index during which
    it was launched, {req_id: blocks} of its riders, blocks whose cache bytes it changed, each of
    its windows' (slots, request slot of each row), {req_id: request slot}, and for a hybrid target
    {req_id: state slot} and the state slots whose rows changed, and the block checkpoints (prefix
    caching) that changed). The snapshots are device ops in stream order, so this holds for
    captured replays too."""
    r, bs = e.runner, e.cache.spec.block_size
    launches = []
    orig_launch, orig_pre = r._launch, r._prelaunch
    riders = []

    def launch(inp):
        if not riders:
            return orig_launch(inp)
        key, value = e.cache.key.clone(), e.cache.value.clone()
        stores = states_of(e)
        before = [t.clone() for t in stores]
        out = orig_launch(inp)
        changed = ((e.cache.key != key) | (e.cache.value != value)).flatten(3).any(-1).any(0)   # [NB, BS]
        written = {s // bs for s in torch.nonzero(changed.flatten()).flatten().tolist()}
        # state store rows [L, S, ...] by slot (dim 1), `current` [S]; checkpoints [L, NB + 1, ...] by block
        moved = [set(torch.nonzero((a != b).flatten(2).any(-1).any(0) if a.dim() > 1 else a != b)
                     .flatten().tolist()) for a, b in zip(stores, before)]
        state = ({q.req_id: q.state_slot for q in riders}, set().union(*moved[:3]) if moved else set(),
                 set().union(*moved[3:]) if len(moved) > 3 else set())
        # each window's slots by request slot (verify, then the chain's): a dead rider's must all be -1
        windows = [(w.slot_mapping.clone(), w.token_req.long().clone())
                   for w in (inp.window, inp.chain.window if inp.chain is not None else None) if w is not None]
        launches.append((e.step_index, {q.req_id: list(q.block_table.blocks) for q in riders}, written, windows,
                         {q.req_id: j for j, q in enumerate(riders)}, state))
        return out

    def prelaunch(inp, requests):
        riders[:] = requests
        try:
            orig_pre(inp, requests)
        finally:
            riders.clear()
        assert all(len(q.block_table.blocks) <= q.worst_case_blocks for q in requests)

    r._launch, r._prelaunch = launch, prelaunch
    return launches


def states_of(e) -> list:
    """A hybrid target's stores a step may write: the state store's recurrent, conv and current,
    then prefix caching's block checkpoints (recurrent, conv); [] without recurrent state."""
    if e.states is None:
        return []
    st = e.states.store
    out = [st.recurrent, st.conv, st.current]
    bsx = e.prefix.block_states if e.prefix is not None else None
    return out + ([bsx.recurrent, bsx.conv] if bsx is not None else [])


def check_dead_riders_untouched(e, launches, write_all: bool) -> int:
    """Every pre-launched step changed only blocks of requests that run on; a request whose last
    window was the step before (a dead rider) kept its blocks' bytes, its state slot's rows and its
    blocks' checkpoints (a hybrid target), and had slot -1 on every row of the step's windows -> the
    dead riders seen (equal to the runner's count)."""
    last = {}
    for t in e.trace:
        if t.kind == "verify":
            for rid in t.req_ids:
                last[rid] = t.step
    seen = 0
    for step, blocks, written, windows, slot_of, (state_slot, moved, checkpoints) in launches:
        # launched during step `step`, it runs as step + 1: riders whose last window was `step` ride dead
        dead = {rid for rid in blocks if last[rid] == step}
        live_blocks = {b for rid, bl in blocks.items() if rid not in dead for b in bl}
        assert written <= live_blocks, (step, written - live_blocks)
        for rid in dead:
            assert not written & set(blocks[rid]), (step, rid)
            for slots, token_req in windows:            # (stage and cow would rewrite equal bytes)
                mine = slots[token_req == slot_of[rid]]
                assert mine.numel() and bool((mine == -1).all()), (step, rid, mine)
            if e.states is not None:
                assert state_slot[rid] not in moved, (step, rid, state_slot[rid])
                assert not checkpoints & set(blocks[rid]), (step, rid)
        if write_all:
            assert written                              # the live riders' rows landed (the check is not vacuous)
        seen += len(dead)
    assert seen == e.runner.dead_riders
    return seen


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_a_dead_riders_blocks_are_not_written_while_its_step_runs(pair, mode):
    """Around every pre-launched launch (CPU: the body runs then), the cache slots whose bytes
    changed all lie in blocks of requests that run on; a request that finished in the step before
    (a dead rider) keeps every byte of its blocks and every row of its verify and chain windows has
    slot -1 (under stage and cow a rewrite of its t_last row would leave equal bytes: the slots are
    what shows it); no request holds more blocks than its worst case."""
    e = engine_for(pair, mode)
    launches = watch_prelaunches(e)
    wave(e)
    assert check_dead_riders_untouched(e, launches, write_all=mode == "off") > 0


def test_refusals_that_remain_are_named(pair):
    """At T > 0 and while a request waits for a seat, a request that may finish keeps the step for
    the host; the reason is one line. At T > 0 the engine's generator draws by request slot: with
    these budgets (request 0 finishes first, the others run on) riding dead moved the others'
    draws and changed their tokens against the host-filled run (measured with the refusal lifted);
    with it, the pre-launch on and off sample the same tokens."""
    budgets = [3, 20, 20, 20]
    got = []
    for prelaunch in (True, False):
        e = engine_for(pair, "stage", temperature=0.8, prelaunch=prelaunch)
        got.append(wave(e, max_new=budgets))
        if prelaunch:
            assert e.runner.dead_riders == 0 and e.runner.prelaunched > 0
            assert "T > 0" in e.runner.dead_rider_refusal()
    assert got[0] == got[1]
    e = engine_for(pair, "stage")
    assert e.runner.dead_rider_refusal() is None
    e.runner.ride_dead = False
    assert "ride_dead" in e.runner.dead_rider_refusal()
    e.runner.ride_dead = True
    e.add_request([1, 2], 3)
    assert "waits" in e.runner.dead_rider_refusal()


def test_riding_dead_off_keeps_the_old_rule(pair):
    """`LabConfig(ride_dead=False)` (a newcomer joins a step sooner): no dead riders, same tokens; the
    field is the runner's switch, and NWOR_LAB_RIDE_DEAD sets it for a sweep."""
    target, head = pair
    e = SpecEngine(target, head, LabConfig(nwor_mode="cow", ride_dead=False), k=3, block_size=4,
                   max_num_seqs=4, num_blocks=128, seed=3)
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    assert e.runner.ride_dead is False
    assert wave(e) == wave(engine_for(pair, "cow", prelaunch=False))
    assert e.runner.dead_riders == 0 and e.runner.prelaunched > 0
    assert LabConfig.from_env(environ={"NWOR_LAB_RIDE_DEAD": "0"}).ride_dead is False


def test_the_serve_driver_sees_no_tokens_of_dead_riders(pair):
    """Closed loop (a new request sent as one finishes): the driver times each request's chunks from
    the trace; a dead rider's step lists it nowhere, so every request's tokens and chunk count match
    its output, and each request decodes what it decodes with the pre-launch off."""
    from nwor_lab.serve.driver import serve
    from nwor_lab.serve.workload import random_specs
    specs = random_specs(8, 6, 10, 0.5, 16, 0)
    outs = []
    for prelaunch in (True, False):
        e = engine_for(pair, "stage", prelaunch=prelaunch)
        run = serve(e, specs, concurrency=3)
        done = sorted(e.scheduler.finished, key=lambda r: r.req_id)
        assert [sum(n for _, n in rec.chunks) for rec in run.requests] == [s.output_len for s in specs]
        outs.append([r.output for r in done])
        if prelaunch:
            assert e.runner.dead_riders > 0
    assert outs[0] == outs[1]


@pytest.fixture(scope="module")
def hybrid():
    from nwor_lab.bench.state import toy_pair as hybrid_pair
    return hybrid_pair()


def hybrid_engine(pair, state_mode, prelaunch, *, k=3, prefix=""):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode="stage", state_mode=state_mode, prefix_cache=prefix),
                   k=k, block_size=4, max_num_seqs=4, num_blocks=128)
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    e.runner.prelaunch = prelaunch
    return e


@pytest.mark.parametrize("state_mode", ["off", "stage", "snapshots", "cow", "replay"])
def test_a_hybrid_targets_dead_riders_run_their_state_window_on_the_scratch_slot(hybrid, state_mode):
    """A hybrid target's decode buckets pre-launched with dead riders: every state strategy decodes
    what it decodes with the pre-launch off (target-only's tokens, or under `off` the same wrong
    ones), traces and records alike; the finished request's own state slot keeps its bytes."""
    from nwor_lab.state import STATE_POLICIES
    assert state_mode in STATE_POLICIES
    runs = []
    for prelaunch in (True, False):
        e = hybrid_engine(hybrid, state_mode, prelaunch)
        launches = watch_prelaunches(e)
        runs.append((wave(e), trace(e), e, launches))
    (on, on_trace, e, launches), (off, off_trace, _, _) = runs
    assert check_dead_riders_untouched(e, launches, write_all=False) > 0
    assert on == off and on_trace == off_trace
    if state_mode != "off":
        assert on == wave(hybrid_engine(hybrid, "stage", False, k=0))


def test_a_hybrid_targets_block_checkpoints_survive_dead_riders(hybrid):
    """With prefix caching (state checkpoints at committed block ends), a second wave of the same
    prompts restores the first wave's checkpoints: the same tokens with the pre-launch on and off."""
    runs = []
    for prelaunch in (True, False):
        e = hybrid_engine(hybrid, "stage", prelaunch, prefix="on")
        launches = watch_prelaunches(e)
        runs.append(([wave(e) for _ in range(2)], trace(e), e, launches))
    (on, on_trace, e, launches), (off, off_trace, e_off, _) = runs
    assert check_dead_riders_untouched(e, launches, write_all=False) > 0 and e.prefix_stats()["hit_tokens"] > 0
    assert on == off and on_trace == off_trace and e.prefix_stats() == e_off.prefix_stats()


@pytest.mark.parametrize("mode,cfg", [("off", dict(sliding_window=12, kv_ring="ring")),
                                      ("stage", dict(sliding_window=12, kv_ring="slack")),
                                      ("stage", dict(forced=(0.9, 0.6, 0.3)))])
def test_rings_and_forced_acceptance_ride_dead_alike(pair, mode, cfg):
    """A sliding window's ring (not the guard, which keeps every step for the host: its drafts may be
    cut) maps a dead rider's rows to slot -1 like any cache; forced acceptance keys its uniforms on
    the prompt and the position, so a dead rider moves no one's verdicts."""
    from nwor_lab.speculative.synthetic import ForcedAcceptance
    cfg = dict(cfg)
    forced = cfg.pop("forced", None)
    target, head = pair
    runs = []
    for prelaunch in (True, False):
        e = SpecEngine(target, head, LabConfig(nwor_mode=mode, **cfg), k=3, block_size=4, max_num_seqs=4,
                       num_blocks=128, acceptance=ForcedAcceptance(forced) if forced else None)
        e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
        e.runner.prelaunch = prelaunch
        launches = watch_prelaunches(e)
        runs.append((wave(e), trace(e), e, launches))
    (on, on_trace, e, launches), (off, off_trace, _, _) = runs
    assert check_dead_riders_untouched(e, launches, write_all=mode == "off") > 0
    assert on == off and on_trace == off_trace


def eos_engine(pair, mode, prelaunch, eos):
    target, head = pair
    e = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=3, block_size=4, max_num_seqs=4, num_blocks=128,
                   eos_token_id=eos)
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    e.runner.prelaunch = prelaunch
    return e


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_a_request_ending_on_an_end_token_rides_dead(pair, mode):
    """An end token ends a request at any step (the device sees it among the tokens it emits:
    `next_inputs`), so with one watched every step may carry a dead rider: tokens, traces and
    records as with the pre-launch off, the dead riders' blocks untouched."""
    free = wave(engine_for(pair, mode, prelaunch=False))
    eos = free[1][3]                    # a token request 1 emits early, while the others run on
    runs = []
    for prelaunch in (True, False):
        e = eos_engine(pair, mode, prelaunch, eos)
        launches = watch_prelaunches(e)
        runs.append((wave(e), trace(e), e, launches))
    (on, on_trace, e, launches), (off, off_trace, _, _) = runs
    assert any(len(o) < n and o[-1] == eos for o, n in zip(on, MAX_NEW))    # an end token ended one
    assert check_dead_riders_untouched(e, launches, write_all=mode == "off") > 0
    assert on == off and on_trace == off_trace


def test_a_step_whose_requests_all_ended_on_end_tokens_is_dropped(pair):
    """One request, an end token mid-way: the step pre-launched after it carries it dead alone;
    the engine collects and drops that step, ends the request, and decodes the next one as usual."""
    free = wave(engine_for(pair, "stage", prelaunch=False), PROMPTS[3:], [16])[0]
    eos = free[8]
    outs = []
    for prelaunch in (True, False):
        e = eos_engine(pair, "stage", prelaunch, eos)
        outs.append([wave(e, PROMPTS[3:], [16]), wave(e, PROMPTS[:1], [12])])
        if prelaunch:
            assert e.runner.dead_riders > 0 and e.runner.pending is None and not e.scheduler.has_work
            steps = e.runner.steps
        else:
            assert e.runner.steps < steps                # the dropped step ran, for nothing
    assert outs[0] == outs[1]
    assert outs[0][0][0][-1] == eos and len(outs[0][0][0]) < 16
