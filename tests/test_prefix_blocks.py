"""The prefix cache's blocks (nwor_lab.kv.prefix): chained keys, reference counts, LRU eviction."""
import subprocess
import sys

import pytest

from nwor_lab.kv import BlockTable, NoFreeBlocksError
from nwor_lab.kv.prefix import CachingAllocator, block_hash, chain_hashes


def test_chained_keys_name_the_whole_prefix():
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    assert len(a) == 3                                  # the partial last block has no hash
    b = chain_hashes([9, 2, 3, 4, 5, 6], 2)
    # the same block tokens after a different first block: a different key for every block after it
    assert a[1] != b[1] and a[2] != b[2]
    assert a[0] == block_hash(None, [1, 2]) and a[1] == block_hash(a[0], [3, 4])
    assert chain_hashes([1, 2, 3, 4], 2) == a[:2]
    assert block_hash(None, [1, 2]) != block_hash(None, [2, 1])


def test_hash_is_the_same_in_another_process():
    code = "from nwor_lab.kv.prefix import chain_hashes; print(chain_hashes([5, 6, 7, 8], 2)[-1].hex())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "", **_pythonpath()}).stdout.strip()
    assert out == chain_hashes([5, 6, 7, 8], 2)[-1].hex()


def _pythonpath():
    import os
    return {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "HOME")}


def test_refcounts_share_and_free():
    al = CachingAllocator(4)
    b = al.allocate(1)[0]
    h = block_hash(None, [1, 2])
    assert al.register(b, h)
    al.share(b)                                  # a second request's hit
    assert al.refs[b] == 2
    al.free([b])                                 # the first holder leaves: still held, not idle
    assert al.refs[b] == 1 and b not in al.idle and al.num_free == 3
    al.free([b])                                 # the last holder leaves: idle, still registered, counted free
    assert b in al.idle and al.lookup([h]) == [b] and al.num_free == 4
    al.share(b)                                  # a hit on an idle block takes it out of the LRU list
    assert al.refs[b] == 1 and b not in al.idle and al.num_free == 3
    with pytest.raises(ValueError, match="double free"):
        al.free([b, b])
    al.free([b])
    with pytest.raises(ValueError, match="not held"):
        al.free([b])


def test_unregistered_block_goes_back_to_the_free_list():
    al = CachingAllocator(2)
    b = al.allocate(1)[0]
    al.free([b])
    assert not al.idle and al.num_free == 2
    with pytest.raises(ValueError, match="not registered"):
        al.share(b)


def test_a_block_is_never_registered_twice():
    al = CachingAllocator(4)
    b1, b2 = al.allocate(2)
    h = block_hash(None, [3, 3])
    assert al.register(b1, h)
    assert not al.register(b2, h)                # the same prefix computed twice: the first copy stays
    assert not al.register(b1, block_hash(None, [4, 4]))    # a block under a second key: refused
    assert al.lookup([h]) == [b1] and al.num_cached == 1
    al.free([b1, b2])
    assert list(al.idle) == [b1] and al.num_free == 4
    with pytest.raises(ValueError, match="not held"):
        al.register(b2, block_hash(None, [5, 5]))


def test_lru_evicts_least_recently_released_tail_first():
    al = CachingAllocator(4)
    hs = chain_hashes([1, 2, 3, 4, 5, 6], 2)
    r1 = al.allocate(3)
    for b, h in zip(r1, hs):
        al.register(b, h)
    al.free(r1)                                  # released last-first: the tail is evicted first
    assert list(al.idle) == [r1[2], r1[1], r1[0]]
    # the free block goes first, then the idle ones, least recently released first
    got = al.allocate(2)
    assert got[0] not in r1 and got[1] == r1[2] and al.evictions == 1
    assert al.lookup(hs) == r1[:2]               # the evicted tail is forgotten, the head is still a hit
    al.share(r1[0])                              # touched: now most recently used when released again
    al.free([r1[0]])
    assert list(al.idle) == [r1[1], r1[0]]
    assert al.allocate(1) == [r1[1]] and al.lookup(hs) == r1[:1]   # block 0 kept, the chain cut after it
    with pytest.raises(NoFreeBlocksError):
        al.allocate(2)


def test_block_table_works_on_the_caching_allocator():
    al = CachingAllocator(3)
    t = BlockTable(al, 2)
    t.ensure(5)
    assert len(t.blocks) == 3 and al.num_free == 0
    for b, h in zip(t.blocks[:2], chain_hashes([0, 1, 2, 3], 2)):
        al.register(b, h)
    t.release()
    assert al.num_free == 3 and al.num_cached == 2
