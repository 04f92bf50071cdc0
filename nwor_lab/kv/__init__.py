"""Paged KV cache: layouts (NHD/HND from strides), block tables, slot mapping, fp8 scales, rings,
content digests of blocks, the prefix cache's chained block hashes and caching allocator."""
from nwor_lab.kv.layout import KVLayout, detect_layout
from nwor_lab.kv.cache import CACHE_DTYPES, KVCacheSpec, PagedKVCache
from nwor_lab.kv.blocks import (BlockAllocator, BlockTable, NoFreeBlocksError, block_table_tensor,
                                build_slot_mapping, slot_to_block_offset)
from nwor_lab.kv.ring import SlidingWindow, evicted_needed
from nwor_lab.kv.digest import block_bytes, block_digest, block_digests
from nwor_lab.kv.prefix import CachingAllocator, block_hash, chain_hashes

__all__ = ["KVLayout", "detect_layout", "CACHE_DTYPES", "KVCacheSpec", "PagedKVCache",
           "BlockAllocator", "BlockTable", "NoFreeBlocksError", "block_table_tensor", "build_slot_mapping",
           "slot_to_block_offset", "SlidingWindow", "evicted_needed", "block_bytes", "block_digest", "block_digests",
           "CachingAllocator", "block_hash", "chain_hashes"]
