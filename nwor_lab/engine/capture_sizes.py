"""Every bucket a configuration can reach, captured before the engine's first step (vLLM's capture sizes).

Without this a bucket is warmed up and captured by the first step that reaches it: a step that
runs three step bodies and a capture inside whatever window is being timed (a serving run's
stall of a few hundred ms when a new batch size first appears). `capture_buckets` runs every
reachable bucket's warm-up and capture before the first request, on buffers that hold padding
only, and logs one line: how many graphs, how long. The runner does it as its first step begins
(`StepRunner.capture_at_start`, from `LabConfig.capture_at_start`), not in the engine's
constructor: what is installed on an engine after it is built (a tensor-parallel rank's agreed
SCV and drafter, a bench's policy, observers) is then what the graphs hold.

The buckets are the window kind's (`WindowKind.start_keys`, asked here): a chain's
(`ChainKind.start_keys`) are, for request slots s in 1, 2, 4, ... up to the runner's `max_size`,
    decode    BucketKey(s, s (d + 1) + 1, d + 1, d > 0, False, d) for each draft count d the step
              can carry: d = k only with a fixed k, every d in 0..k with a `draft_counts` hook
              (so for k = 4 and 64 requests: 7 decode graphs, or 35 with a hook);
    prefill   BucketKey(s, token_bucket(t), 0, drafting, False, k) for every token count t a step of
              s slots can hold (at least one row a request, at most `max_num_batched_tokens`,
              within the reserved staging rows); steps mixing prefills and decodes use these too.
A hybrid target captures its decode buckets only (its prefills run the chunked form, eager).
At start, prefill buckets of more than `START_MAX_ROWS` rows are left to their first use (as vLLM
caps its capture sizes): a configuration with a large token budget (`bench step`'s 64 x 1025 rows)
reaches many of them, and a long prefill's capture costs little next to its own run. Up to it
there are ~30 prefill buckets a slot size (`buffers.token_bucket`: 8 a doubling from 128 rows),
captured largest first into one shared pool (`StepRunner._capture`), so their memory is about
the largest one's.
Draft trees are left to be captured on first use (`TreeKind.start_keys` is empty: their inputs
are filled from a tree plan, not checked here with padding only), and so is every engine whose
steps never run from a bucket (`StepRunner.never_static`).

An all-padding step writes nothing (every slot -1, no request's state slot), and the runner
restores what the policies count; the engine's generator is put back to its state before the
warm-ups, so a seeded run draws the same numbers with or without capture at start.
"""
from __future__ import annotations

import logging
import time

import torch

from nwor_lab.engine.buffers import LARGE_TOKENS, BucketKey, bucket_size
from nwor_lab.engine.step import StepInputs

log = logging.getLogger("nwor_lab.engine")

START_MAX_ROWS = LARGE_TOKENS     # prefill buckets up to this many rows are captured at start


def reachable_buckets(runner) -> list[BucketKey]:
    """The bucket keys (`StepRunner._key`) the runner's engine can reach, as its window kind lists
    them (`start_keys`: decode buckets first, smallest first; [] for a kind captured at first use);
    [] when its steps never run from a bucket."""
    if runner.never_static():
        return []
    return runner.engine.window_kind.start_keys(runner)


def start_buckets(runner) -> list[BucketKey]:
    """The reachable buckets captured at start: every decode bucket (in the kind's order), then the
    prefill buckets of at most `START_MAX_ROWS` rows, largest first: their graphs share one memory
    pool (`StepRunner._capture`), where each smaller one fits in what the larger ones freed."""
    keys = reachable_buckets(runner)
    prefill = sorted((key for key in keys if not key.max_query_len and key.tokens <= START_MAX_ROWS),
                     key=lambda key: (key.tokens, key.size), reverse=True)
    return [key for key in keys if key.max_query_len] + prefill


@torch.no_grad()             # as `SpecEngine.step`: the body writes the cache in place
def capture_buckets(runner, keys: list[tuple] | None = None) -> tuple[int, float]:
    """Warm up and capture every key of `keys` (default: `start_buckets`) not captured yet, on
    padding-only inputs -> (graphs captured, seconds). With the runner's `capture` off (CPU) the
    same bodies run eagerly (what the tests check: an all-padding step leaves no trace)."""
    e = runner.engine
    keys = start_buckets(runner) if keys is None else keys
    if runner.pending is not None:
        raise RuntimeError("capture_buckets: a step is pre-launched; capture before the first step")
    state = e.generator.get_state()
    t0 = time.perf_counter()
    done = 0
    try:
        for key in keys:
            key = BucketKey(*key)
            if bucket_size(key.size) != key.size:
                raise ValueError(f"capture_buckets: key {key}: request slots must be a power of two")
            inp = runner.buckets.get(key)
            if inp is None:
                inp = runner.buckets[key] = StepInputs.of_key(e, key, static=True)
            if inp.graph is not None:
                continue
            e.window_kind.fill(e, inp, [], [])
            while inp.graph is None:
                was_warm = inp.warmed
                runner._launch(inp)         # warm-up, then capture (and its replay)
                if was_warm and not runner.capture:
                    break                   # nothing captures here: warm-up and one more body
            done += 1
        if e.device.type == "cuda":
            torch.cuda.synchronize(e.device)
    finally:
        e.generator.set_state(state)
    seconds = time.perf_counter() - t0
    if done:
        log.info("captured %d step graphs before serving in %.2f s (buckets of %s request slots)",
                 done, seconds, sorted({key.size for key in keys}))
    runner.startup_capture = (done, seconds)
    return done, seconds
