"""Tensor parallelism over `torch.distributed` (NCCL on CUDA, gloo on CPU): the engine and every
write policy on tp ranks, each rank holding its KV heads of every cache layer (docs/tensor_parallel.md).

  TPGroup               a rank's group and the collectives the lab uses (timeouts -> CollectiveError)
  shard_llama, shard_head, load_llama_tp, load_tiny_tp
                        Megatron-style shards of the Llama and its EAGLE-1 / EAGLE-3 heads
  make_tensor_parallel, TPSpecEngine
                        the ordinary SpecEngine as one rank: rank 0's sampler output on every rank
  launch, run_ranks     start tp ranks (torch.multiprocessing, spawn) or run under torchrun;
                        a failed rank stops the run with a TensorParallelError naming it
  generate, generate_many
                        `engine.generate` over tp ranks
"""
from nwor_lab.distributed.checks import FaultInjector, ShardAudit
from nwor_lab.distributed.engine import (AgreedDrafter, AgreedScv, CrossRankCheck, TPSpecEngine,
                                         make_tensor_parallel)
from nwor_lab.distributed.generate import RankReport, ToyPair, TPGenerationResult, generate, generate_many
from nwor_lab.distributed.group import CollectiveError, TPGroup
from nwor_lab.distributed.launcher import TensorParallelError, in_torchrun, launch, run_ranks
from nwor_lab.distributed.shard import (RowParallelLinear, check_tp, kv_heads, load_llama_tp, load_tiny_tp, q_heads,
                                        shard_head, shard_llama, slice_state, tp_config)

__all__ = ["TPGroup", "CollectiveError", "shard_llama", "shard_head", "load_llama_tp", "load_tiny_tp", "slice_state",
           "tp_config", "check_tp", "q_heads", "kv_heads", "RowParallelLinear", "make_tensor_parallel",
           "TPSpecEngine", "AgreedScv", "AgreedDrafter", "CrossRankCheck", "launch", "run_ranks", "in_torchrun",
           "TensorParallelError", "generate", "generate_many", "TPGenerationResult", "RankReport", "ToyPair", "ShardAudit",
           "FaultInjector"]
