"""Five exercises in the GPU-Puzzles habit: a spec, a checker, a picture of the counterexample.

  (a) slot_mapping       where each window token's K/V goes          check_slot_mapping
  (b) acceptance_mask    which drafts survived (prefix rule, bounds)  check_acceptance_mask
  (c) stage_commit_rows  which staged rows the commit writes, where   check_stage_commit_rows
  (d) cow_restore        put back the rejected drafts' old bits       check_cow_restore
  (e) ring_evictions     what a write-all window loses on a ring      check_ring_evictions
                         (chapter 07_sliding_window)

Each spec is the docstring of the reference in `nwor_lab.exercises.solutions`. A checker runs
your function on 300 cases (edge cases first), prints `PASS (300 cases)` or the first
counterexample, and returns a `CheckResult` whose `figure` draws it.

    from nwor_lab import exercises
    fn = exercises.choose("slot_mapping", my_slot_mapping, use_solutions)
    exercises.check_slot_mapping(fn)
"""
from nwor_lab.exercises import solutions
from nwor_lab.exercises.check import CheckResult
from nwor_lab.exercises.slot_mapping import check_slot_mapping
from nwor_lab.exercises.acceptance_mask import check_acceptance_mask
from nwor_lab.exercises.stage_commit_rows import check_stage_commit_rows
from nwor_lab.exercises.cow_restore import check_cow_restore
from nwor_lab.exercises.ring_evictions import check_ring_evictions

NAMES = ("slot_mapping", "acceptance_mask", "stage_commit_rows", "cow_restore", "ring_evictions")


def choose(name: str, user_fn, use_solutions: bool = False):
    """`solutions.<name>` when `use_solutions` (CI runs the chapter that way), else `user_fn`."""
    if name not in NAMES:
        raise ValueError(f"name={name!r}: choose one of {', '.join(NAMES)}")
    return getattr(solutions, name) if use_solutions else user_fn


def spec(name: str) -> str:
    """The spec of exercise `name` (the reference's docstring)."""
    return choose(name, None, use_solutions=True).__doc__


__all__ = ["solutions", "CheckResult", "choose", "spec", "NAMES", "check_slot_mapping",
           "check_acceptance_mask", "check_stage_commit_rows", "check_cow_restore", "check_ring_evictions"]
