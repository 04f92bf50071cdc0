"""A step's buffers: static inputs filled from pinned host mirrors with one copy per dtype, the
packed readback (the step's one sync), and the bucket sizes a captured step is padded to."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class StaticInputs:
    """A graph's static input tensors, as views of one device buffer per dtype, filled from a
    pinned host mirror (numpy views: `host[name]`) with one copy per dtype (`upload`).

    Two mirrors, used in turn: when a step is pre-launched, the copy enqueued for the step before
    it may still be pending while the host writes the next mirror; the one before that has
    completed (the host read that step's outputs, which the stream ordered after the copy)."""

    def __init__(self, device: torch.device, **specs):
        """specs: name=(shape, dtype)."""
        pin = device.type == "cuda"
        self.dev: dict[str, torch.Tensor] = {}
        self._mirrors: list[dict[str, np.ndarray]] = [{}, {}]
        self._views: list[dict[str, torch.Tensor]] = [{}, {}]
        self._groups = []
        self._turn = 0
        for dtype in {d for _, d in specs.values()}:
            names = [n for n, (_, d) in specs.items() if d == dtype]
            sizes = [int(np.prod(specs[n][0])) for n in names]
            dev = torch.zeros(sum(sizes), dtype=dtype, device=device)
            hosts = [torch.zeros(sum(sizes), dtype=dtype, pin_memory=pin) for _ in range(2)]
            self._groups.append((dev, hosts))
            at = 0
            for name, size in zip(names, sizes):
                shape = specs[name][0]
                self.dev[name] = dev[at:at + size].view(shape)
                for mirror, views, host in zip(self._mirrors, self._views, hosts):
                    views[name] = host[at:at + size].view(shape)
                    mirror[name] = views[name].numpy()
                at += size

    @property
    def host(self) -> dict[str, np.ndarray]:
        """The mirror to write now (every field of it: the other mirror holds an older step)."""
        return self._mirrors[self._turn]

    def upload(self) -> None:
        for dev, hosts in self._groups:
            dev.copy_(hosts[self._turn], non_blocking=True)
        self._turn ^= 1

    def upload_only(self, name: str) -> None:
        """Send one field of the mirror to write now (the rest of the device buffers keep what the
        device wrote there: a pre-launched step's inputs)."""
        self.dev[name].copy_(self._views[self._turn][name], non_blocking=True)
        self._turn ^= 1


class Readback:
    """A step's packed outputs copied into pinned host memory right after its launch (two
    buffers, used in turn, so a pre-launched step's copy never overwrites one not yet read)."""

    def __init__(self, device: torch.device, shape):
        self.cuda = device.type == "cuda"
        self._bufs = [torch.zeros(shape, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)]
        self._turn = 0

    def start(self, packed: torch.Tensor):
        """Enqueue the copy of `packed` -> a handle for `rows`."""
        buf = self._bufs[self._turn]
        self._turn ^= 1
        buf.copy_(packed, non_blocking=True)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        return buf, event

    @staticmethod
    def rows(handle, n: int) -> list[list[int]]:
        """Wait for the copy (the step's one sync) -> its first n rows."""
        buf, event = handle
        if event is not None:
            event.synchronize()
        return buf[:n].tolist()


class BucketKey(NamedTuple):
    """What a step's buffers are keyed by (`StepRunner.buckets` / `exact`, the window kind's
    `bucket_key`): request slots, rows, the max query length a request (0: unknown, a step with
    prefills), whether the draft chain rides aboard, whether a tree window is verified, and `k`:
    the draft slots a request in the sampler's layout (a decode bucket's: the step's draft count d,
    0..the engine's k; every other step's: the engine's)."""
    size: int
    tokens: int
    max_query_len: int
    chain: bool
    tree: bool
    k: int


def bucket_size(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def max_blocks(engine) -> int:
    return -(-engine.max_model_len // engine.cache.spec.block_size) + 1


LARGE_TOKENS = 1024      # from here on, token buckets grow by 512 tokens instead of doubling
FINE_ROWS = 128          # from here on (to LARGE_TOKENS), token buckets split each doubling evenly
STEPS_PER_DOUBLING = 8   # ... into this many buckets (1: powers of two)


def token_bucket(n: int) -> int:
    """Rows of the bucket holding n tokens, always > n (one padding row at least): powers of two
    from 16 to `FINE_ROWS` (128), then `STEPS_PER_DOUBLING` (8) even steps a doubling to 1024
    (144, 160, ... 256, 288, ... 512, 576, ... 1024), then multiples of 512 (a prefill of 2048
    tokens pads to 2560, not 4096).

    Why finer from 128 rows: below it the 8B shape's GEMMs are weight-bound on an H100/H200 (64
    or 128 rows cost one read of the weights), so padding is nearly free and fewer graphs are
    better; above it they cost their FLOPs, padding rows too. EAGLE-3 k 4 at 32 clients mixes 160
    verify rows with one or two 64-token prompts: 200-400 rows, which powers of two padded to 256
    and 512. On an H200 at 32 clients, EAGLE-3 k 4 over target-only went from 2.086x to 2.125x
    on one machine and from 2.134x to 2.169x on another (4 steps: 2.150x). What it costs: 173
    graphs instead of 47 at 32 request slots, captured in ~15-30 s instead of ~12-16 s; their
    memory stays small because the prefill buckets' graphs share one pool (`StepRunner._capture`:
    4.2 GiB for the EAGLE engine's cache and graphs, against 7.8 GiB with powers of two and a pool
    a graph). benchmarks/results/serve_buckets_8b_h200.json."""
    if n >= LARGE_TOKENS:
        return (n // 512 + 1) * 512
    if n < FINE_ROWS:
        return max(16, 1 << n.bit_length())
    step = (1 << (n.bit_length() - 1)) // STEPS_PER_DOUBLING
    return (n // step + 1) * step


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
