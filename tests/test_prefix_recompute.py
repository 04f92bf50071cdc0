"""head_cache='recompute' (toy pair, CPU): a hit gets private copies of its blocks whose head rows
are recomputed from a target forward over the hit. Tokens are target-only's and every verify window
accepts what it accepts without prefix caching, in every write policy, even when the cached blocks'
head rows were dropped (what `missing` does); every hit token is counted as recomputed; registered
blocks are never written; a hybrid target is refused by name."""
import pytest

from nwor_lab.config import NWOR_MODES
from nwor_lab.engine.prefix import MissingHead, PrefixCacheConfig
from test_prefix_engine import RegisteredBlocks, run, workload
from nwor_lab.model.toy import toy_pair

RECOMPUTE = PrefixCacheConfig(head_cache="recompute")


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def accepted(engine):
    return [w.accepted for w in engine.trace if w.kind == "verify"]


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_recompute_is_exact_and_counts_its_forward(pair, mode):
    ref = run(pair, workload(), k=0)[0]
    plain = accepted(run(pair, workload(), mode=mode)[1])
    out, e, _ = run(pair, workload(), mode=mode, prefix=RECOMPUTE, observers=[RegisteredBlocks()])
    assert out == ref and accepted(e) == plain
    st = e.prefix_stats()
    assert st["hit_tokens"] > 0 and st["recomputed_tokens"] == st["head_rows_recomputed"] == st["hit_tokens"]
    assert st["blocks_copied"] * 4 == st["hit_tokens"]


def test_recompute_does_not_read_the_cached_head_rows(pair):
    """With the cached blocks' head rows dropped as `missing` drops them, `missing` loses acceptance
    and `recompute` does not."""
    plain = accepted(run(pair, workload())[1])
    missing = run(pair, workload(), prefix=PrefixCacheConfig(head_cache="missing"))[1]
    assert accepted(missing) != plain

    class Dropping:
        """An observer that, once the engine is built, makes idle cached blocks lose their head rows."""
        def __init__(self):
            self.armed, self.dropped = False, 0

        def on_phase(self, event):
            pass

        def on_window_end(self, engine, entry, window):
            if not self.armed:
                engine.prefix.head_cache.on_idle = self.drop
                self.armed = True

        def drop(self, engine, block):
            MissingHead().on_idle(engine, block)
            self.dropped += 1

    dropping = Dropping()
    out, e, _ = run(pair, workload(), prefix=RECOMPUTE, observers=[dropping])
    assert dropping.dropped >= 3 and accepted(e) == plain


def test_recompute_refused_on_a_hybrid_target():
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    from nwor_lab.model.toy import toy_hybrid, toy_hybrid_head
    target = toy_hybrid(2)
    with pytest.raises(ValueError, match="recompute.*hybrid"):
        SpecEngine(target, toy_hybrid_head(target, 3), LabConfig(nwor_mode="stage", state_mode="stage"), k=3,
                   block_size=4, num_blocks=32, prefix_cache=RECOMPUTE)


def test_recompute_with_an_eagle3_head():
    """EAGLE-3 reads the target's auxiliary layers: the recomputing forward hands them to the head."""
    from nwor_lab.model.toy import toy_config, toy_eagle3
    target, _ = toy_pair(2, cfg=toy_config(num_hidden_layers=4))
    pair3 = (target, toy_eagle3(target, seed=3, draft_vocab_size=12))
    ref = run(pair3, workload(), k=0)[0]
    plain = accepted(run(pair3, workload())[1])
    out, e, _ = run(pair3, workload(), prefix=RECOMPUTE)
    assert out == ref and accepted(e) == plain and e.prefix_stats()["recomputed_tokens"] > 0
