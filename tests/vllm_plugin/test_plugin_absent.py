"""vLLM with the plugin not loaded at all (VLLM_PLUGINS names another plugin): the same greedy
tokens; vLLM's own EAGLE-1 head drops the shipped fc.bias, so its acceptance (by vLLM's own
counters, on both sides) is lower than with the plugin's head."""
import json
import os
import subprocess
import sys

from conftest import PROMPTS, lab_generate

SCRIPT = """
import json, logging
logging.disable(logging.WARNING)
from nwor_lab.vllm.generate import VllmLab
lab = VllmLab("eagle", 4, plugin=False, keep_fc_bias=False)
res = lab.generate({prompts!r}, 32)
import vllm.plugins as p
print("RESULT" + json.dumps({{"token_ids": res.token_ids, "mean": res.mean_acceptance_length,
                              "by_pos": res.acceptance_by_position}}))
"""


def test_plugin_absent_gives_the_same_tokens(shipped):
    env = dict(os.environ, VLLM_PLUGINS="not-nwor-lab", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(prompts=PROMPTS)], env=env, capture_output=True,
                          text=True, timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    absent = json.loads(line[0][len("RESULT"):])
    lab = lab_generate(shipped, "eagle", PROMPTS, 32)
    assert absent["token_ids"] == lab.token_ids
    # the same engine settings with the plugin's head (settings off: vLLM's counters, as the absent run)
    from nwor_lab.vllm.generate import VllmLab
    with_bias = VllmLab("eagle", 4, plugin=False)
    ours = with_bias.generate(PROMPTS, 32)
    with_bias.close()
    assert ours.token_ids == lab.token_ids
    # vLLM's own head (fc without bias) drafts worse than the shipped head the plugin loads
    assert absent["mean"] < ours.mean_acceptance_length - 0.1, (absent["mean"], ours.mean_acceptance_length)
