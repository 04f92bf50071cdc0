"""Prefill-to-decode hand-off (disaggregated serving): a prefill engine runs a request's prompt and
ships its committed blocks (target layers and the head's layer N), its state, tokens and drafts to
a decode engine, which decodes with EAGLE (docs/handoff.md: the protocol).

  HANDOFF_STRATEGIES, handoff_strategy   what is shipped: nwor, write_all, no_head, no_state
  Shipment, export_request, install      one request's frame: export, wire format, install
  differing_rows                         committed rows that arrived other than a reference's (target-only)
  InProcess, TorchDistributed            transports (inprocess; gloo and nccl: the same calls)
  CudaIpc, run_ipc_handoff               cuda_ipc: two processes on one GPU (nwor_lab.disagg.ipc)
  prefill, decode, handoff, EnginePair, HandoffResult
                                         the two halves, in one process
  run_handoff, run_rounds, ONE_ENGINE    two processes (nwor_lab.disagg.ranks): one hand-off, or a
                                         schedule of strategies and one-engine references
"""
from nwor_lab.disagg.handoff import EnginePair, HandoffResult, decode, handoff, prefill
from nwor_lab.disagg.ipc import CudaIpc
from nwor_lab.disagg.observer import RejectedRows
from nwor_lab.disagg.ranks import ONE_ENGINE, run_handoff, run_ipc_handoff, run_rounds
from nwor_lab.disagg.shipment import PROTOCOL, Shipment, differing_rows, export_request, install
from nwor_lab.disagg.strategies import HANDOFF_STRATEGIES, HandoffStrategy, handoff_strategy
from nwor_lab.disagg.transport import TRANSPORTS, InProcess, TorchDistributed

__all__ = ["HANDOFF_STRATEGIES", "HandoffStrategy", "handoff_strategy", "Shipment", "export_request", "install",
           "PROTOCOL", "differing_rows", "InProcess", "TorchDistributed", "TRANSPORTS", "prefill", "decode", "handoff", "run_handoff",
           "EnginePair", "HandoffResult", "RejectedRows", "CudaIpc", "run_ipc_handoff", "run_rounds", "ONE_ENGINE"]
