"""Staggered arrivals, mixed prefill + decode + speculative steps, an aborted request: the cache
stays consistent (every window checked) and the survivors' tokens are the lab engine's."""
import pytest

from conftest import lab_generate

LONG = "class Parser:\n    def __init__(self, text):\n        self.text = text\n        self.pos = 0\n"


@pytest.mark.parametrize("mode", ["stage", "cow"])
def test_staggered_arrivals_and_an_abort(mode, shipped):
    from vllm import SamplingParams

    from nwor_lab.vllm.generate import VllmLab
    lab = VllmLab("eagle", 4, nwor_mode=mode, check=True, debug=True)
    engine = lab.llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = {"a": LONG, "b": "import os\n", "c": "def parse_args(argv):", "d": "for i in range("}
    done, steps = {}, 0
    engine.add_request("a", prompts["a"], params)
    while engine.has_unfinished_requests():
        if steps == 2:
            engine.add_request("b", prompts["b"], params)
            engine.add_request("c", prompts["c"], params)
        if steps == 4:
            engine.add_request("d", prompts["d"], params)      # a prefill beside speculative requests
        if steps == 5:
            engine.abort_request(["b"])
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
    rt = lab.runtime
    assert "b" not in done and set(done) == {"a", "c", "d"}
    assert rt.totals.checks_passed == len(rt.trace) > 0
    mixed = [w for w in rt.trace if w.kind == "verify" and len(set(w.drafted)) > 1]
    assert mixed, "no step mixed a prefill or plain decode with speculative requests"
    for name in ("a", "c", "d"):
        assert done[name] == lab_generate(shipped, "eagle", [prompts[name]], 24).token_ids[0], name
    lab.close()
