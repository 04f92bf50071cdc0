"""Speculative decoding pieces: window metadata, rejection sampler, SCV acceptance masks.

  SpecDecodeMetadata   vLLM v1's per-window draft ids and logits indices (`metadata`)
  rejection_sample     greedy + stochastic verification -> sampled ids [R, max_spec_len + 1]
  compute_acceptance   draft_mask / accepted_len / commit_mask from sampled ids (`scv`)
  ScvRunner            the same per SCV mode, keeping CUDA-graph state between windows
"""
from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.speculative.sampler import PLACEHOLDER_TOKEN_ID, rejection_sample
from nwor_lab.speculative.scv import Acceptance, ScvRunner, acceptance_loop, compute_acceptance

__all__ = ["SpecDecodeMetadata", "PLACEHOLDER_TOKEN_ID", "rejection_sample", "Acceptance",
           "ScvRunner", "acceptance_loop", "compute_acceptance"]
