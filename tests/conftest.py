"""Shared test set-up: GPU tests are skipped where CUDA is absent (CI, laptops)."""
import os

import pytest
import torch

# Hypothesis: deterministic in CI, bounded time per example.
try:
    from hypothesis import settings
    settings.register_profile("ci", derandomize=True, deadline=None, max_examples=40)
    settings.register_profile("dev", deadline=None, max_examples=25)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # pragma: no cover
    pass


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- the toy pairs the engine-level CPU tests share (prefix, preemption, chunked prefill, hybrid) --
# Building a toy model takes milliseconds; what the session scope buys is one definition of each pair
# (the seeds and shapes the tests' expected numbers were written for). Tests build fresh engines from
# them: an engine holds every piece of per-run state (cache, scheduler, generator), the models none.

@pytest.fixture(scope="session")
def toy_eagle1_pair():
    """(target, EAGLE-1 head), seed 0: the pair most CPU engine tests decode with."""
    from nwor_lab.model.toy import toy_pair
    return toy_pair(0)


@pytest.fixture(scope="session")
def toy_eagle3_pair():
    """(4-layer target, EAGLE-3 head with a 12-token draft vocabulary)."""
    from nwor_lab.model.toy import toy_config, toy_eagle3, toy_pair
    target, _ = toy_pair(2, cfg=toy_config(num_hidden_layers=4))
    return target, toy_eagle3(target, seed=3, draft_vocab_size=12)


@pytest.fixture(scope="session")
def toy_hybrid_pair():
    """(gated DeltaNet + attention target, its head)."""
    from nwor_lab.model.toy import toy_hybrid, toy_hybrid_head
    target = toy_hybrid(2)
    return target, toy_hybrid_head(target, 3)


def toy_engine(pair, *, k=4, head=True, mode="stage", state_mode=None, observers=(), debug=False, cfg=None,
               **engine_kw):
    """A fresh SpecEngine over a toy pair (modules import it: `from conftest import toy_engine`); k=0 is target-only, head=False passes no head (k kept).
    `cfg`: more LabConfig fields; `engine_kw`: SpecEngine keywords (block_size, num_blocks, max_num_seqs,
    prefix_cache, preemption...)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    target, h = pair
    fields = {"nwor_mode": mode, "debug": debug, **({"state_mode": state_mode} if state_mode else {}), **(cfg or {})}
    e = SpecEngine(target, h if head and k else None, LabConfig(**fields), k=k, **engine_kw)
    e.observers.extend(observers)          # the policies share this list
    return e

