"""Speculative decoding pieces: window metadata, rejection sampler, SCV acceptance masks.

  SpecDecodeMetadata   vLLM v1's per-window draft ids and logits indices (`metadata`)
  rejection_sample     greedy + stochastic verification -> sampled ids [R, max_spec_len + 1]
  compute_acceptance   draft_mask / accepted_len / commit_mask from sampled ids (`scv`)
  ScvRunner            the same per SCV mode, keeping CUDA-graph state; `.accept(window, sampled)`
  check_against_sampler  debug: an Acceptance equals the host loop over the sampler's output
"""
from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.speculative.sampler import PLACEHOLDER_TOKEN_ID, rejection_sample, sample_from_probs
from nwor_lab.speculative.scv import ScvRunner, acceptance_loop, check_against_sampler, compute_acceptance
from nwor_lab.window import Acceptance

__all__ = ["SpecDecodeMetadata", "PLACEHOLDER_TOKEN_ID", "rejection_sample", "sample_from_probs", "Acceptance",
           "ScvRunner", "acceptance_loop", "check_against_sampler", "compute_acceptance"]
