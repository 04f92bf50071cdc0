"""Exercise (t) prefix_blocks (chapter 15): planted wrong answers are caught, in words and in a picture,
and the reference registers what the engine's prefix cache registers. (That it passes, says "not
attempted yet" for a stub and answers its prediction is checked for every exercise in tests/test_exercises.py.)"""
import pytest
import torch

from exercise_tools import caught
from nwor_lab import exercises
from nwor_lab.exercises import solutions


def _blocks(table, lo, hi):
    return table[lo:max(lo, hi)].long().clone()


def written_not_committed(block_size, block_table, num_computed, num_drafts, accepted_len, write_policy):
    """Registers every block the verify pass filled under write-all (drafts included)."""
    stop = num_computed + 1 + (num_drafts if write_policy == "off" else accepted_len)
    return _blocks(block_table, num_computed // block_size, stop // block_size)


def forgets_t_last(block_size, block_table, num_computed, num_drafts, accepted_len, write_policy):
    return _blocks(block_table, num_computed // block_size, (num_computed + accepted_len) // block_size)


def counts_the_bonus(block_size, block_table, num_computed, num_drafts, accepted_len, write_policy):
    """The bonus token is emitted, but its K/V is computed by the next window."""
    return _blocks(block_table, num_computed // block_size, (num_computed + 2 + accepted_len) // block_size)


def registers_again(block_size, block_table, num_computed, num_drafts, accepted_len, write_policy):
    return _blocks(block_table, 0, (num_computed + 1 + accepted_len) // block_size)


def indices_not_ids(block_size, block_table, num_computed, num_drafts, accepted_len, write_policy):
    return torch.arange(len(block_table))[num_computed // block_size:(num_computed + 1 + accepted_len) // block_size]


def partial_too(block_size, block_table, num_computed, num_drafts, accepted_len, write_policy):
    return _blocks(block_table, num_computed // block_size, -(-(num_computed + 1 + accepted_len) // block_size))


@pytest.mark.parametrize("fn, note, words", [
    (written_not_committed, "write-all filled the block", "partial"),
    (forgets_t_last, "t_last alone fills a block", ""),
    (counts_the_bonus, "block size 1", "partial"),
    (registers_again, "block boundary", "earlier commit registered it"),
    (indices_not_ids, "t_last alone", ""),
    (partial_too, "nothing fills a block", "partial"),
])
def test_prefix_blocks_checker_finds_the_usual_mistakes(fn, note, words):
    caught("prefix_blocks", fn, note, words)


def test_prefix_blocks_checker_names_a_wrong_dtype():
    def int32(**kw):
        return solutions.prefix_blocks(**kw).int()
    r = exercises.check("prefix_blocks", int32, show=False)
    assert r.status == "fail" and "int32" in r.message, r.message


def test_the_reference_registers_what_the_engine_registers():
    """A toy pair under each write policy with prefix caching on: after every verify window, the blocks
    the engine registered for each request are the ones the reference names (the accepted drafts a
    request keeps: its last window may be cut by max_new_tokens)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.prefix import PrefixCacheConfig
    from nwor_lab.model.toy import toy_pair

    for mode in ("off", "cow", "stage"):
        target, head = toy_pair(0)
        e = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=3, block_size=4, num_blocks=64, max_num_seqs=2,
                       prefix_cache=PrefixCacheConfig())
        reqs = [e.add_request([1, 2, 3, 4, 5], 14), e.add_request([6, 7], 11)]
        seen = checked = 0
        while e.scheduler.has_work:
            before = {r.req_id: (r.num_computed, len(r.drafts), list(r.block_table.blocks)) for r in reqs
                      if not r.finished and not r.is_prefill}
            registered, windows = set(e.prefix.allocator.hash_of), len(e.trace)
            e.step()
            new = set(e.prefix.allocator.hash_of) - registered
            w = next(t for t in e.trace[windows:] if t.kind == "verify")
            expected = set()
            for rid, k, emitted in zip(w.req_ids, w.drafted, w.emitted):
                a = len(emitted) - 1          # accepted drafts kept (max_new_tokens may cut the last window)
                if rid in before:
                    n, _, table = before[rid]
                    got = solutions.prefix_blocks(4, torch.tensor(table), n, int(k), int(a), mode)
                    expected |= set(got.tolist())
                    checked += 1
            if w.kind == "verify" and all(rid in before for rid in w.req_ids):
                assert new == expected, (mode, w, new, expected)
                seen += len(new)
        assert seen > 0 and checked > 0, mode
