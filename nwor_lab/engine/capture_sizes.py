"""Every bucket a configuration can reach, captured before the engine's first step (vLLM's capture sizes).

Without this a bucket is warmed up and captured by the first step that reaches it: a step that
runs three step bodies and a capture inside whatever window is being timed (a serving run's
stall of a few hundred ms when a new batch size first appears). `capture_buckets` runs every
reachable bucket's warm-up and capture before the first request, on buffers that hold padding
only, and logs one line: how many graphs, how long. The runner does it as its first step begins
(`StepRunner.capture_at_start`, from `LabConfig.capture_at_start`), not in the engine's
constructor: what is installed on an engine after it is built (a tensor-parallel rank's agreed
SCV and drafter, a bench's policy, observers) is then what the graphs hold.

The buckets (`StepRunner._key` with `static`): request slots s in 1, 2, 4, ... up to the
runner's `max_size`, and per s
    decode    (s, s (k + 1) + 1, k + 1, drafting, False): every request t_last + its drafts;
    prefill   (s, token_bucket(t), 0, drafting, False) for every token count t a step of s slots
              can hold (at least one row a request, at most `max_num_batched_tokens`, within the
              reserved staging rows); steps mixing prefills and decodes use these buckets too.
A hybrid target captures its decode buckets only (its prefills run the chunked form, eager).
At start, prefill buckets of more than `START_MAX_ROWS` rows are left to their first use (as vLLM
caps its capture sizes): a configuration with a large token budget (`bench step`'s 64 x 1025 rows)
reaches a hundred of them, each a graph with its own memory pool, and a long prefill's capture
costs little next to its own run.
Draft trees are left to be captured on first use (`capture_buckets` skips them: their inputs are
filled from a tree plan, not checked here with padding only), and so is every engine whose steps
never run from a bucket (`StepRunner.never_static`).

An all-padding step writes nothing (every slot -1, no request's state slot), and the runner
restores what the policies count; the engine's generator is put back to its state before the
warm-ups, so a seeded run draws the same numbers with or without capture at start.
"""
from __future__ import annotations

import logging
import time

import torch

from nwor_lab.engine.buffers import LARGE_TOKENS, bucket_size, token_bucket
from nwor_lab.engine.step import StepInputs, chain_k

log = logging.getLogger("nwor_lab.engine")

START_MAX_ROWS = LARGE_TOKENS     # prefill buckets up to this many rows are captured at start


def slot_sizes(max_size: int) -> list[int]:
    """Request-slot buckets 1, 2, 4, ... up to `max_size` (a power of two, `bucket_size`)."""
    return [1 << i for i in range(max_size.bit_length()) if 1 << i <= max_size]


def prefill_token_buckets(size: int, max_tokens: int, reserved: int) -> list[int]:
    """Row buckets of a step with prefills in `size` request slots: `token_bucket(t)` for every
    token count t it can hold (the fewest requests that pad to `size`, one row each, up to
    `max_tokens`), those within `reserved` rows (`StepRunner.capturable`)."""
    fewest = size // 2 + 1 if size > 1 else 1
    out = set()
    t = fewest
    while t <= max_tokens:
        b = token_bucket(t)
        if b <= reserved:
            out.add(b)
        t = b               # token_bucket(t) > t: the next count lands in the next bucket
    return sorted(out)


def reachable_buckets(runner) -> list[tuple]:
    """The bucket keys (`StepRunner._key`) the runner's engine can reach, decode buckets first
    (smallest first); [] when its steps never run from a bucket or its window kind is captured at
    first use (trees). The keys are the chain kind's (`ChainKind.bucket_key`, static)."""
    e = runner.engine
    if runner.never_static() or not e.window_kind.captures_at_start:
        return []
    k = chain_k(e)
    keys = []
    for s in slot_sizes(runner.max_size):
        keys.append((s, s * (k + 1) + 1, k + 1, e.drafting, False))
    if e.states is None:                 # a hybrid target's prefills stay eager
        for s in slot_sizes(runner.max_size):
            for rows in prefill_token_buckets(s, runner.max_tokens, runner.reserved):
                keys.append((s, rows, 0, e.drafting, False))
    return keys


def start_buckets(runner) -> list[tuple]:
    """The reachable buckets captured at start: every decode bucket, prefill buckets of at most
    `START_MAX_ROWS` rows."""
    return [key for key in reachable_buckets(runner) if key[2] or key[1] <= START_MAX_ROWS]


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
            if bucket_size(key[0]) != key[0]:
                raise ValueError(f"capture_buckets: key {key}: request slots must be a power of two")
            inp = runner.buckets.get(key)
            if inp is None:
                size, tokens, qmax, chain, tree = key
                inp = runner.buckets[key] = StepInputs(e, size, tokens, qmax, chain=chain, static=True, tree=tree)
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
                 done, seconds, sorted({key[0] for key in keys}))
    runner.startup_capture = (done, seconds)
    return done, seconds
