"""What every graphed step shares: static inputs filled from pinned host mirrors, the packed
readback, and the capture protocol of a bucket (nwor_lab.engine.graphed, .graphed_chain,
.graphed_mixed)."""
from __future__ import annotations

import numpy as np
import torch

from nwor_lab.ops.graphs import capture_graph
from nwor_lab.ops.scv import scv_mask
from nwor_lab.window import Acceptance


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
                for mirror, host in zip(self._mirrors, hosts):
                    mirror[name] = host[at:at + size].view(shape).numpy()
                at += size

    @property
    def host(self) -> dict[str, np.ndarray]:
        """The mirror to write now (every field of it: the other mirror holds an older step)."""
        return self._mirrors[self._turn]

    def upload(self) -> None:
        for dev, hosts in self._groups:
            dev.copy_(hosts[self._turn], non_blocking=True)
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


def bucket_size(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def max_blocks(engine) -> int:
    return -(-engine.max_model_len // engine.cache.spec.block_size) + 1


class GraphedBucket:
    """The capture protocol every bucket shares: first call eager (warm-up, compiles), second
    captures then replays, later calls replay. `body(engine)` is the step on static buffers."""

    graph = None
    outputs = None
    warmed = False

    def body(self, engine):
        raise NotImplementedError

    def run(self, engine, capture: bool, policies=()):
        """-> the body's outputs. When the body's Python ran (warm-up, capture, or no capture),
        the windows its `policies` opened and committed are taken off their counts again: the
        host counts every window once, after the step (`WritePolicy.replayed`)."""
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        if not self.warmed or not capture:
            self.warmed = True
            out = self.body(engine)
        else:
            holder = {}
            self.graph = capture_graph(lambda: holder.setdefault("out", self.body(engine)), warmup=0,
                                       device=engine.device)
            self.outputs = out = holder["out"]
            self.graph.replay()
        for p in policies:
            p.windows_done -= 1
        return out


def accept_draft_commit(e, w, md, sampled, hidden, aux, ids, last_rows, first_kept, no_drafts):
    """After a graphed step's verify (every bucket kind): SCV's acceptance of the sampler's output
    `sampled [B, k + 1]`, the head's first pass over the window when the engine drafts, the policy's
    commit. `first_kept [B]`: each request's row of t_last (its kept rows follow it), `last_rows [B]`
    its last row. -> (accepted [B] int64, kept [B]: each request's last kept row, head features at
    those rows [B, h] or None). `no_drafts`: the bucket's all-zero Acceptance when its windows
    hold no drafts (k 0), else None."""
    if no_drafts is None:               # the bucket's windows hold drafts
        acceptance = Acceptance(*scv_mask(w.draft_token_ids, w.cu_num_draft_tokens, sampled, w.token_req,
                                          w.token_draft_pos))
    else:
        acceptance = no_drafts
    accepted = acceptance.accepted_len.long()
    kept = first_kept + accepted
    features = None
    if e.drafting:
        # the head reads x[p+1]: the next row's token, and at the kept and last rows the token just sampled
        token = sampled.gather(1, accepted[:, None]).squeeze(1).long()
        next_ids = torch.cat([ids[1:], ids.new_zeros(1)])
        next_ids[last_rows] = token
        next_ids[kept] = token
        g = e.head(next_ids, e.head.features_from_target(hidden, aux), md)
        features = g[kept]
    e.policy.commit(acceptance)
    return accepted, kept, features
