"""Speculative decoding pieces: window metadata, rejection sampler, SCV acceptance masks.

  SpecDecodeMetadata   vLLM v1's per-window draft ids and logits indices (`metadata`)
  rejection_sample     greedy + stochastic verification -> sampled ids [R, max_spec_len + 1]
  compute_acceptance   draft_mask / accepted_len / commit_mask from sampled ids (`scv`)
  ScvRunner            the same per SCV mode, keeping CUDA-graph state; `.accept(window, sampled)`
  check_against_sampler  debug: an Acceptance equals the host loop over the sampler's output
  accept_tree_*        tree windows: greedy / recursive rejection sampling / SCV from sampled ids
  dynamic_tree, static_tree  draft trees (EAGLE-2, fixed shapes) around a head's step
"""
from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.speculative.sampler import PLACEHOLDER_TOKEN_ID, rejection_sample, sample_from_probs
from nwor_lab.speculative.scv import ScvRunner, acceptance_loop, check_against_sampler, compute_acceptance
from nwor_lab.speculative.tree_accept import (TreeVerdict, accept_tree_from_sampled, accept_tree_greedy,
                                              accept_tree_sampled)
from nwor_lab.speculative.tree_draft import DraftTree, dynamic_tree, static_tree
from nwor_lab.window import Acceptance

__all__ = ["SpecDecodeMetadata", "PLACEHOLDER_TOKEN_ID", "rejection_sample", "sample_from_probs", "Acceptance",
           "ScvRunner", "acceptance_loop", "check_against_sampler", "compute_acceptance", "TreeVerdict",
           "accept_tree_greedy", "accept_tree_sampled", "accept_tree_from_sampled", "DraftTree", "dynamic_tree",
           "static_tree"]
