"""The tensor-parallel group a rank belongs to: its rank, the world size, its device, and the few
collectives the lab needs, over `torch.distributed` (NCCL on CUDA, gloo on CPU).

Every collective goes through `TPGroup`, which turns a failed collective (a peer rank died, or did
not arrive within the group's timeout) into a `CollectiveError` naming the operation, the rank and
the timeout, so a launcher can tell a rank's own failure from its peers' consequence of it.
`TPGroup.single(device)` is the group of one rank (tp = 1): every collective is a no-op, no
`torch.distributed` needed.
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 60.0     # collective timeout: a peer that does not arrive within it is an error


class CollectiveError(RuntimeError):
    """A collective failed on this rank because of a peer (it died, or missed the timeout)."""


def default_backend(device) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums of `t`'s bits (plain and position-weighted): equal on two ranks iff, but for a
    collision, the tensors are bit-identical."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.detach().contiguous().view(ints).reshape(-1).to(torch.int64)
    pos = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64)
    return torch.stack([bits.sum(), (bits * pos).sum()])


class TPGroup:
    """One rank's view of its tensor-parallel group (`rank` in `0..world_size-1`, `device`)."""

    def __init__(self, rank: int, world_size: int, device="cpu", backend: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, process_group=None):
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = torch.device(device)
        self.backend = backend or default_backend(self.device)
        self.timeout_s = float(timeout_s)
        self.process_group = process_group      # None: the default group (when world_size > 1)
        # debug: after every all-reduce, compare a fingerprint of the result's bits over the ranks
        self.check_bits = False
        self.reductions = 0                     # all-reduces done
        self.bit_mismatches = 0                 # ... whose result differed in some bit between ranks

    def __repr__(self) -> str:
        return (f"TPGroup(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"backend={self.backend!r})")

    @classmethod
    def single(cls, device="cpu") -> "TPGroup":
        """tp = 1: one rank, no collectives."""
        return cls(0, 1, device)

    @classmethod
    def init(cls, rank: int, world_size: int, device="cpu", backend: str | None = None,
             init_method: str = "env://", timeout_s: float = DEFAULT_TIMEOUT_S) -> "TPGroup":
        """`torch.distributed.init_process_group` for this rank (with the collective timeout), then
        the group. `init_method`: `env://` (torchrun's MASTER_ADDR/MASTER_PORT), `tcp://host:port`
        or `file:///path` (what `launch` uses)."""
        device = torch.device(device)
        backend = backend or default_backend(device)
        if backend == "nccl":
            # NVLink SHARP multicast stays off (the lab's GPU machines do not lend it reliably)
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            # a rank stuck in a collective aborts after the timeout instead of hanging
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
            torch.cuda.set_device(device)
        kw = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kw)
        return cls(rank, world_size, device, backend, timeout_s)

    @classmethod
    def from_env(cls, device=None, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> "TPGroup":
        """The group of a process started by `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT);
        device default: `cuda:LOCAL_RANK` for NCCL, else CPU."""
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if device is None:
            device = f"cuda:{local}" if (backend or "") != "gloo" and torch.cuda.is_available() else "cpu"
        if dist.is_initialized():
            return cls(rank, world, device, backend or dist.get_backend(), timeout_s)
        return cls.init(rank, world, device, backend, "env://", timeout_s)

    # -- collectives (all no-ops for one rank) -------------------------------------------------
    def _run(self, what: str, fn):
        try:
            return fn()
        except (RuntimeError, ValueError) as err:  # DistBackendError, gloo/NCCL errors, timeouts
            raise CollectiveError(f"rank {self.rank}: {what} failed ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''}); a peer rank died or "
                                  f"did not arrive within the collective timeout of {self.timeout_s:g} s") from err

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place; every rank ends with the same bits (the reduced tensor is
        computed once and copied, in gloo's and NCCL's ring / tree algorithms alike)."""
        if self.world_size > 1:
            self._run("all_reduce", lambda: dist.all_reduce(t, group=self.process_group))
            self.reductions += 1
            if self.check_bits:
                fp = fingerprint(t).to(self.device)
                if any(not torch.equal(f, fp) for f in self.all_gather(fp)):
                    self.bit_mismatches += 1
        return t

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank `src`'s `t` on every rank, in place (a non-contiguous `t` is filled through a copy)."""
        if self.world_size == 1:
            return t
        buf = t if t.is_contiguous() else t.contiguous()
        self._run("broadcast", lambda: dist.broadcast(buf, src, group=self.process_group))
        if buf is not t:
            t.copy_(buf)
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `t` (same shape and dtype on every rank), in rank order."""
        if self.world_size == 1:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        self._run("all_gather", lambda: dist.all_gather(out, t.contiguous(), group=self.process_group))
        return out

    def all_gather_ragged(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's 1-d `t`, lengths may differ (two collectives: the lengths, then the padded data)."""
        if self.world_size == 1:
            return [t]
        n = torch.tensor([t.numel()], dtype=torch.long, device=self.device)
        sizes = [int(s) for s in self.all_gather(n)]
        pad = torch.zeros(max(sizes), dtype=t.dtype, device=self.device)
        pad[:t.numel()] = t.reshape(-1)
        return [g[:s] for g, s in zip(self.all_gather(pad), sizes)]

    def barrier(self) -> None:
        if self.world_size > 1:
            self._run("barrier", lambda: dist.barrier(group=self.process_group))
