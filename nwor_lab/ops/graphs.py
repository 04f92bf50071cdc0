"""CUDA-graph capture, written once: warm up on a side stream, then record `fn` into a graph.

Why a side stream: the first call of an op loads modules, allocates and may sync; none of that
may happen during capture. torch's own capture also runs on a side stream, so the warm-up does
the same and the capture replays exactly what the warm-up did.
"""
from __future__ import annotations

import gc
from typing import Callable, Sequence

import torch


def capture_graph(fn: Callable[[], object], *, warmup: int = 1, device=None,
                  generators: Sequence[torch.Generator] = (), pool=None) -> torch.cuda.CUDAGraph:
    """Run `fn` `warmup` times on a side stream, then capture one call of it; returns the graph
    (replay it with `graph.replay()`; `fn`'s tensors are its static inputs and outputs).

    generators: CUDA generators `fn` draws from besides torch's default one (which every capture
    registers itself). Each is registered with the graph before its capture begins: the captured
    kernels read the generator's seed and offset when the graph replays, and each replay advances
    the offset by what the captured draws consumed, as the same draws run eagerly would (so a
    seeded run draws the same numbers captured or eager, and a replay never repeats a draw).

    pool: a memory pool (`torch.cuda.graph_pool_handle()`) this capture shares with others captured
    into it (None: a pool of its own). Sharing is safe only for graphs that never run at once and
    whose captures leave no tensor alive that a later replay of another graph could overwrite:
    `fn` must write its results into tensors allocated before the capture (what the pool frees
    at the end of one capture, the next may use for its own intermediates)."""
    device = torch.device("cuda") if device is None else torch.device(device)
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        for g in generators:
            graph.register_generator_state(g)
        # No garbage collection while capturing: torch's `graph` collects once before it begins, but a
        # collection that `fn`'s own allocations trigger mid-capture may finalise an object that calls
        # the CUDA API (an event, a stream, pinned host memory), which a capturing stream refuses, and
        # the process aborts (seen on an H200 when every bucket was captured at engine start).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=pool):
                fn()
        finally:
            if was_enabled:
                gc.enable()
    return graph


def graph_pool(device) -> object:
    """A new memory pool that CUDA graphs captured on `device` may share (`capture_graph(pool=)`)."""
    with torch.cuda.device(torch.device(device)):
        return torch.cuda.graph_pool_handle()
