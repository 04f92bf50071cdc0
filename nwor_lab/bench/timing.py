"""How the engine benchmarks time a run (`bench engine`, both pairs): the prompts queued on a built
engine and run to the end (`run_prompts`, all at once or arriving one every few steps), each
run timed with the device synchronised (`timed`), and the protocol (`time_engine`): one cold run
(compiles the kernels, warms every batch bucket up), one run that captures each bucket's CUDA
graph, then `repeats` timed runs, their median reported. `time_engines_interleaved` runs that protocol
over several engines at once, their timed runs taken in turn (ABBA), so clock drift falls on all alike."""
from __future__ import annotations

import gc
import platform
import random
import time

import numpy as np
import torch


def device_name(device) -> str:
    """A result's `device`: the card's name on CUDA, else the CPU and the threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def free_device(device) -> None:
    """Drop what a deleted engine held (reference cycles: its runner's graphs and their pools)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench_device(bench: str, arg, model: str, default_cuda: bool | None = None) -> torch.device:
    """The `--device` of `nwor-lab bench <bench>` (checked; default cuda when present, or as
    `default_cuda` says); the 8B shape refused off CUDA, naming the toy shape that runs the same path."""
    from nwor_lab.commandline.environment import check_device_arg
    from nwor_lab.commandline.errors import UsageError
    cuda = torch.cuda.is_available() if default_cuda is None else default_cuda
    device = torch.device(check_device_arg("--device", arg or ("cuda" if cuda else "cpu")))
    if model.startswith("8b") and not model.endswith("-mini") and device.type != "cuda":
        raise UsageError(f"bench {bench} --model {model}: needs a CUDA device (the 8B shape's weights, 16 GB or "
                         f"more); --model {model}-mini runs the same code path on CPU")
    return device


def timed(fn, device) -> tuple[object, float]:
    """`fn()` -> (its result, seconds), the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def run_prompts(engine, prompts, new_tokens: int, arrival_gap: int = 0) -> list:
    """Queue `prompts` on `engine` and run it to the end -> the requests. arrival_gap > 0: the
    prompts arrive one every `arrival_gap` engine steps (requests join a running batch: the
    serving case, which mixes prefills into decode steps) instead of all at once."""
    if not arrival_gap:
        reqs = [engine.add_request(p, new_tokens) for p in prompts]
        engine.run()
        return reqs
    queue, reqs, step = list(prompts), [], 0
    while queue or engine.scheduler.has_work:
        if queue and step % arrival_gap == 0:
            reqs.append(engine.add_request(queue.pop(0), new_tokens))
        if engine.scheduler.has_work:
            engine.step_with_progress()
        step += 1
    return reqs


def in_turn(items, repeat: int) -> list:
    """`items` in the order repeat `repeat` takes them: as given on even repeats, reversed on odd ones
    (ABBA), so that none is always timed first."""
    items = list(items)
    return items[::-1] if repeat % 2 else items


ORDERS = ("abba", "shuffle")


def in_order(items, repeat: int, order: str = "abba", seed: int = 0) -> list:
    """`items` in the order repeat `repeat` takes them: `abba` (`in_turn`), or `shuffle`, a permutation
    of its own each repeat (seeded by `seed` and the repeat): no item keeps the same neighbours, so a
    cost that one case leaves to the next (clocks, caches) spreads over all of them instead of landing
    on the same pair every round, as it can with a fixed order."""
    if order == "abba":
        return in_turn(items, repeat)
    if order != "shuffle":
        raise ValueError(f"in_order: order={order!r}; one of {ORDERS}")
    items = list(items)
    random.Random(seed * 1_000_003 + repeat).shuffle(items)
    return items


def time_engine(engine, prompts, new_tokens: int, repeats: int, device, arrival_gap: int = 0,
                cold: float | None = None) -> dict:
    """The bench's protocol on a built engine: one cold run (compiles, warms every bucket up; its
    time `cold` when the caller ran it), one run that captures the buckets' graphs, then `repeats`
    timed runs; -> their times, the last run's requests, and the trace and target forwards of
    the timed runs."""
    return time_engines_interleaved({"": engine}, prompts, new_tokens, repeats, device, arrival_gap,
                                    None if cold is None else {"": cold})[""]


def time_engines_interleaved(engines: dict, prompts, new_tokens: int, repeats: int, device, arrival_gap: int = 0,
                             cold: dict | None = None) -> dict:
    """`time_engine` over {name: engine} (the same prompts), the timed runs in turn (`in_turn`, ABBA),
    so drift between runs (clocks, a neighbour) hits every engine alike and their ratio holds where
    one engine's runs one after the other do not (a single run per policy ordered `off` and `stage`
    either way by up to 8 %, H200). cold: {name: seconds} of cold runs the caller made.
    -> {name: time_engine's dict, plus `paired` [repeats] its times over the first engine's}."""
    names = list(engines)

    def go(name):
        return run_prompts(engines[name], prompts, new_tokens, arrival_gap)
    out = {}
    for name in names:
        c = cold[name] if cold else timed(lambda: go(name), device)[1]
        go(name)                                   # captures the buckets' graphs
        out[name] = dict(cold=c, times=[], requests=None, first=len(engines[name].trace),
                         forwards=engines[name].target_forwards)
    for i in range(repeats):
        for name in in_turn(names, i):
            reqs, t = timed(lambda: go(name), device)
            out[name]["times"].append(t)
            out[name]["requests"] = reqs
    for name in names:
        e, r = engines[name], out[name]
        r["trace"] = e.trace[r.pop("first"):]
        r["forwards"] = (e.target_forwards - r["forwards"]) // repeats
        r["seconds"] = float(np.median(r["times"]))
        r["paired"] = [t / t0 for t, t0 in zip(r["times"], out[names[0]]["times"])]
    return out
