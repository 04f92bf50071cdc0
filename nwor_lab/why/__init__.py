"""Why the write discipline matters, measured on the lab's own runs (chapter 01_why).

  drafts.RedrawRejected    an engine observer that changes only the drafts a greedy target rejects
  runs.run_request         one request decoded alone; what its blocks hold afterwards (CacheRun)
  runs.same_blocks         per block: equal content digests in two runs? (differing_over_time: after each window)
  runs.rejected_bytes      rejected K/V a request's blocks carry at its end
  stats.WriteTimeAmax      a per-block statistic computed as K/V arrive (an fp8 scale's amax)
  claims                   the seed documents' claims, and the stored measurements that answer them

Importing it imports no plotting; the figures are in `nwor_lab.viz.why`.
"""
from nwor_lab.why.drafts import RedrawRejected
from nwor_lab.why.runs import (CacheRun, Snapshot, differing_over_time, differing_slots, reference_outputs, rejected_bytes,
                               run_request, same_blocks)
from nwor_lab.why.stats import FP8_E4M3_MAX, WriteTimeAmax, block_amax

__all__ = ["RedrawRejected", "CacheRun", "Snapshot", "run_request", "reference_outputs", "same_blocks",
           "differing_over_time", "differing_slots",
           "rejected_bytes", "WriteTimeAmax", "block_amax", "FP8_E4M3_MAX"]
