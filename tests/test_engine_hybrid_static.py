"""A hybrid target's decode steps on their bucket's padded buffers (the body the runner captures in a
CUDA graph, run here without one): the state window opened in the device layout (rows, drafts and
state slots as device data; padding requests on the store's scratch slot), fed on the device by the
step before (pre-launch). Under every state strategy it decodes what the eager, exact-size steps
decode: target-only's tokens, or, under `off`, the same wrong ones. Prefills stay eager. The
captured graphs themselves: tests/gpu/test_gpu_state_engine.py."""
import pytest

from nwor_lab.bench.state import toy_pair
from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.state import STATE_POLICIES
from nwor_lab.engine.runner import StepRunner

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def pair():
    return toy_pair()


def decode(pair, k: int, state_mode: str, padded: bool):
    target, head = pair
    engine = SpecEngine(target, head if k else None, LabConfig(nwor_mode="stage", state_mode=state_mode), k=k,
                        block_size=4, max_num_seqs=4)
    if padded:
        engine.runner = StepRunner(engine, 4, 1024, capture=False, pad=True)
    reqs = [engine.add_request(p, 14) for p in PROMPTS]
    engine.run()
    return [r.output for r in reqs], engine.runner


@pytest.fixture(scope="module")
def target_only(pair):
    return decode(pair, 0, "stage", False)[0]


@pytest.mark.parametrize("state_mode", list(STATE_POLICIES))
def test_the_static_bucket_step_decodes_what_the_eager_step_does(pair, target_only, state_mode):
    # 3 requests, 4 slots: a bucket of 4 with a padding request, then buckets of 2 and 1 as requests end
    static, runner = decode(pair, 3, state_mode, True)
    if state_mode == "off":        # wrong, but wrong alike: the same rows advance the same states
        assert static == decode(pair, 3, "off", False)[0] != target_only
    else:
        assert static == target_only
    assert runner.graphed_steps > 0 and runner.prelaunched > 0       # decode buckets, fed on the device
    assert runner.prefill_steps == 0                                  # prefills stay eager (host counts)
    assert 4 in {inp.size for inp in runner.buckets.values()}
