"""The head's cache on a prefix hit, measured on the shipped trained pair (where acceptance means
something): `cached` keeps the acceptance a request gets without prefix caching, `missing` (SGLang
#31600) keeps the tokens and loses acceptance; the lookahead strategies' hit rates."""
import pytest

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.model import load_tiny
from test_engine_shipped import PROMPTS

SYSTEM = ("# Utilities for reading configuration files.\nimport os\nimport sys\n\n\n"
          "def read_lines(path):\n    with open(path) as f:\n        return f.read().splitlines()\n\n\n")
BS = 8


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def run(tiny, texts, prefix=None, k=4, new=32, num_blocks=256):
    """Requests one after another (each finds the ones before it cached, and idle).
    -> (outputs, per-request acceptance length, engine)."""
    target, head, tok = tiny
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode="stage", scv_mode="graph"), k=k,
                   block_size=BS, num_blocks=num_blocks, max_num_seqs=1, prefix_cache=prefix)
    reqs = [e.add_request(tok.encode(t).ids, new) for t in texts]
    e.run()
    acc = {r.req_id: [] for r in reqs}
    for w in e.trace:
        if w.kind == "verify":
            for rid, n, a in zip(w.req_ids, w.drafted, w.accepted):
                if n:
                    acc[rid].append(a)
    return [r.output for r in reqs], [sum(v) / len(v) if v else 0.0 for v in acc.values()], e


def test_head_cache_strategies_after_a_hit(tiny):
    """Each prompt twice: the second time it hits all its blocks but the last token's."""
    texts = PROMPTS + PROMPTS
    n = len(PROMPTS)
    ref = run(tiny, texts, k=0)[0]
    plain_out, plain, _ = run(tiny, texts)
    cached_out, cached, ec = run(tiny, texts, PrefixCacheConfig(head_cache="cached"))
    missing_out, missing, em = run(tiny, texts, PrefixCacheConfig(head_cache="missing"))
    assert plain_out == cached_out == missing_out == ref            # the target verifies: tokens exact
    assert ec.prefix_stats()["hit_requests"] == em.prefix_stats()["hit_requests"] == n
    assert cached == plain                                          # the head's cache rode with the block
    # without the head's K/V of the hit, acceptance after the hit falls (SGLang #31600's failure)
    mean = lambda xs: sum(xs) / len(xs)                             # noqa: E731
    assert mean(missing[n:]) < mean(plain[n:]) - 0.5, (missing, plain)
    assert missing[:n] == plain[:n]                                  # before any hit: the same


def test_lookahead_hit_rate_parity_on_the_shipped_pair(tiny):
    """A shared system prompt, then a returning prompt: `boundary` hits what target-only hits,
    `drop_last` one block less per hit."""
    texts = [SYSTEM + PROMPTS[0], SYSTEM + PROMPTS[1], SYSTEM + PROMPTS[0]]
    only = run(tiny, texts, PrefixCacheConfig(), k=0)[2].prefix_stats()
    exact = run(tiny, texts, PrefixCacheConfig(lookahead="boundary"))[2].prefix_stats()
    drop = run(tiny, texts, PrefixCacheConfig(lookahead="drop_last"))[2].prefix_stats()
    assert exact["hit_tokens"] == only["hit_tokens"] > 0 and only["hit_requests"] == 2
    assert drop["hit_tokens"] == only["hit_tokens"] - BS * only["hit_requests"]
