"""Dead riders under CUDA graphs: captured decode buckets pre-launched while a request finishes in
the step before (it rides the replay dead: remaining 0 on the device, slot -1 on its rows, no
drafts). The CPU tests run the same body eagerly on the same padded buffers
(tests/test_prelaunch_finish.py); this is the replay itself. Greedy tokens, every window's trace
and record equal the same captured engine's with the pre-launch off, with and without prefix
caching (a second wave hits the first wave's blocks); the dead riders' blocks keep their bytes and
their rows have slot -1 (snapshots taken in stream order around each pre-launched replay)."""
import sys
from pathlib import Path

import pytest

from nwor_lab import LabConfig
from nwor_lab.engine import SpecEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # tests/: the CPU file's helpers
from test_prelaunch_finish import check_dead_riders_untouched, trace, watch_prelaunches, wave  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair(toy_pair16):
    return toy_pair16


def engine(pair, mode, prelaunch: bool, *, k=3, prefix=""):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, scv_mode="graph", prefix_cache=prefix),
                   k=k, block_size=4, max_num_seqs=4, num_blocks=128)
    assert e.runner.capture and e.graphed_off is None, e.graphed_off
    e.runner.prelaunch = prelaunch
    return e


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("prefix", ["", "on"])
@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_replayed_steps_carry_dead_riders_and_decode_alike(pair, mode, prefix, k):
    runs = []
    for prelaunch in (True, False):
        e = engine(pair, mode, prelaunch, k=k, prefix=prefix)
        launches = watch_prelaunches(e) if prelaunch else None
        tokens = [wave(e) for _ in range(2 if prefix else 1)]
        runs.append((tokens, trace(e), e, launches))
    (on, on_trace, e, launches), (off, off_trace, e_off, _) = runs
    assert e.runner.replays > 0 and e.runner.prelaunched > 0 and e_off.runner.prelaunched == 0
    assert check_dead_riders_untouched(e, launches, write_all=mode == "off") > 0
    assert on == off
    assert on_trace == off_trace


@pytest.fixture(scope="module")
def hybrid(hybrid_pair16):
    return hybrid_pair16


@pytest.mark.parametrize("prefix", ["", "on"])
@pytest.mark.parametrize("state_mode", ["stage", "snapshots", "replay"])
def test_gpu_hybrid_replays_run_dead_riders_on_the_scratch_slot(hybrid, state_mode, prefix):
    """A hybrid target's captured decode buckets (a strategy that declares `capture_off` runs eagerly
    and pre-launches nothing: skipped): the dead rider's state slot and block checkpoints keep
    their bytes, tokens and traces equal the run with the pre-launch off."""
    target, head = hybrid
    runs = []
    for prelaunch in (True, False):
        e = SpecEngine(target, head, LabConfig(nwor_mode="stage", state_mode=state_mode, scv_mode="graph",
                                               prefix_cache=prefix), k=3, block_size=4, max_num_seqs=4, num_blocks=128)
        if e.graphed_off is not None:
            pytest.skip(e.graphed_off)
        e.runner.prelaunch = prelaunch
        launches = watch_prelaunches(e) if prelaunch else None
        runs.append(([wave(e) for _ in range(2 if prefix else 1)], trace(e), e, launches))
    (on, on_trace, e, launches), (off, off_trace, _, _) = runs
    assert e.runner.replays > 0 and e.runner.prelaunched > 0
    assert check_dead_riders_untouched(e, launches, write_all=False) > 0
    assert on == off and on_trace == off_trace


@pytest.mark.parametrize("mode", ["off", "stage"])
def test_gpu_replays_see_end_tokens(pair, mode):
    """An end token ends a request inside a replay (the captured `next_inputs` compares the emitted
    tokens with it): tokens and traces as with the pre-launch off, the dead riders' blocks untouched."""
    target, head = pair
    free = wave(engine(pair, mode, False))
    eos = free[1][3]
    runs = []
    for prelaunch in (True, False):
        e = SpecEngine(target, head, LabConfig(nwor_mode=mode, scv_mode="graph"), k=3, block_size=4,
                       max_num_seqs=4, num_blocks=128, eos_token_id=eos)
        e.runner.prelaunch = prelaunch
        launches = watch_prelaunches(e) if prelaunch else None
        runs.append((wave(e), trace(e), e, launches))
    (on, on_trace, e, launches), (off, off_trace, _, _) = runs
    assert e.runner.replays > 0
    assert check_dead_riders_untouched(e, launches, write_all=mode == "off") > 0
    assert on == off and on_trace == off_trace
