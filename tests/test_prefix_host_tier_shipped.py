"""The host tier's offload strategies on the shipped trained pair (where acceptance means something):
each prompt twice through a device cache that evicts it in between, so every second visit is a host
hit. `target_head` keeps the acceptance a request gets without prefix caching; `target_only` (the
field's failure: vLLM's CPU offload with EAGLE off, SGLang #31600) keeps the tokens and loses it."""
import pytest

from nwor_lab.engine.prefix import PrefixCacheConfig
from test_engine_shipped import PROMPTS
from test_prefix_shipped import run

NUM_BLOCKS = 12          # one request's worst case fits; the four prompts' cached blocks do not


@pytest.fixture(scope="module")
def tiny():
    from nwor_lab.model import load_tiny
    return load_tiny()


@pytest.mark.slow
def test_offload_strategies_after_a_host_hit(tiny):
    texts = PROMPTS + PROMPTS
    n = len(PROMPTS)
    ref = run(tiny, texts, k=0)[0]
    plain_out, plain, _ = run(tiny, texts)
    got = {}
    for offload in ("target_head", "target_only"):
        out, acc, e = run(tiny, texts, PrefixCacheConfig(host_blocks=64, offload=offload), num_blocks=NUM_BLOCKS)
        s = e.prefix_stats()
        assert out == plain_out == ref                                  # the target verifies: tokens exact
        assert s["host_hit_requests"] == n and s["host_hit_tokens"] == s["hit_tokens"] > 0, s
        got[offload] = acc
    assert got["target_head"] == plain                                  # the head's K/V came back with the block
    mean = lambda xs: sum(xs) / len(xs)                                 # noqa: E731
    assert got["target_only"][:n] == plain[:n]                          # before any hit: the same
    assert mean(got["target_only"][n:]) < mean(plain[n:]) - 0.5, (got, plain)
