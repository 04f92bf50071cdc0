"""The settings that keep every step of an engine eager, in one ordered table of (condition, reason).

`StepRunner.never_static` asks whether any condition holds (then no step runs from a bucket);
`engine.eager_reason` names the first that holds, in one line (`SpecEngine.graphed_off`). Both
read `EAGER_RULES`, so a rule added here is both obeyed and named.

A condition is `(engine, runner, capture) -> bool`: `capture` says whether steps would be captured
(the runner's `capture`, or True where the question is "why would an engine that asked for CUDA
graphs stay eager"); a rule that matters only to a capture (SCV's host loop runs fine on padded
buffers eagerly) reads it. A reason is a string, or `engine -> str` where the engine's parts word it.
"""
from __future__ import annotations

from nwor_lab.engine.step import reads_log


def _kind_reason(e) -> str:
    return e.window_kind.eager_reason or ("the window kind keeps its steps eager here "
                                          "(StepRunner.tree_graphs is False: tree steps stay eager)")


def _state_reason(e) -> str:
    if e.states.capture_off:
        return f"the recurrent-state strategy keeps every step eager: {e.states.capture_off}"
    return (f"the recurrent-state strategy cannot open windows of {e.k + 1} rows a request in the device layout: "
            f"every step runs eagerly (a smaller k fits)")


EAGER_RULES = (
    (lambda e, runner, capture: reads_log(e),
     "a ring whose policy reads evicted rows from its log runs every step eagerly: captured steps read no log"),
    (lambda e, runner, capture: not e.window_kind.capturable(runner), _kind_reason),
    (lambda e, runner, capture: capture and e.scv.mode == "off",
     "scv_mode='off' computes each window's acceptance in a host loop, which a CUDA graph cannot hold: "
     "every step with drafts runs eagerly (scv_mode='graph' computes the same acceptance on the device)"),
    (lambda e, runner, capture: e.config.debug,
     "debug=True checks every step on the host: every step runs eagerly (debug=False replays graphs)"),
    (lambda e, runner, capture: bool(e.observers),
     "observers see every phase of every window on the host: every step runs eagerly (detach them to replay graphs)"),
    # T > 0 is not here: captured steps draw from `engine.generator` only, which every capture
    # registers (`StepRunner.rng_generators`); per-request generators are refused on an engine that
    # captures (`request.check_request_generator`), so no captured step meets one
    (lambda e, runner, capture: e.states is not None and (bool(e.states.capture_off)
                                                          or not e.states.fits_device_layout(e.k + 1)),
     _state_reason),
)


def eager_rule(e, runner, capture: bool) -> str | None:
    """The reason of the first rule of `EAGER_RULES` that holds (None: none does)."""
    for holds, reason in EAGER_RULES:
        if holds(e, runner, capture):
            return reason(e) if callable(reason) else reason
    return None
