"""How a shipment's frame travels from the prefill engine to the decode engine: one setting.

    inprocess  a queue in this process (tests, chapters): the same encode / decode as the wire
    gloo       torch.distributed point-to-point on CPU tensors, between two processes (the lab's
               launcher: nwor_lab.distributed.launch, a FileStore, a collective timeout)
    nccl       the same calls on CUDA tensors, where each engine has its own GPU (prefill rank on
               cuda:0, decode rank on cuda:1): the rows go GPU to GPU, never through host memory.
               Not run here (no GPU on the machine this was written on): the gloo path runs the same
               code on the CPU; tests/gpu/test_gpu_handoff_nccl.py runs it on two cards
    cuda_ipc   two processes sharing one GPU (the transport for one card): the K/V rows and state
               stay on the GPU and travel as CUDA IPC handles, the control messages over gloo
               (nwor_lab.disagg.ipc; GPU only)

Over torch.distributed (gloo, nccl) a shipment goes as: its frame's length (`[1]` int64), the frame
(`[n]` uint8: the header and the small host tensors, with the rows' manifest), then each K/V or
state tensor (`ROW_PREFIXES`) as its own message of raw bytes, from and into the rank's device: under
NCCL the rows are gathered on the prefill GPU and land on the decode GPU as they are.
"""
from __future__ import annotations

from collections import deque

import torch

from nwor_lab.disagg.shipment import _DTYPES, Shipment

TRANSPORTS = ("inprocess", "gloo", "nccl", "cuda_ipc")
ROW_PREFIXES = ("key.", "value.", "state.")     # the tensors that travel as messages of their own
WIRE = "_wire"                                   # the frame's header key for the rows' manifest


class InProcess:
    """Frames through a queue: `send` encodes, `recv` decodes (first in, first out)."""

    name = "inprocess"

    def __init__(self):
        self.frames: deque = deque()
        self.bytes_sent = 0

    def send(self, shipment: Shipment) -> None:
        frame = shipment.encode()
        self.bytes_sent += frame.numel()
        self.frames.append(frame)

    def recv(self) -> Shipment:
        if not self.frames:
            raise RuntimeError("InProcess.recv: nothing was sent")
        return Shipment.decode(self.frames.popleft())


class TorchDistributed:
    """Frames between this rank and `peer` of `group` (a nwor_lab.distributed.TPGroup), point to
    point; a peer that dies or misses the group's timeout is a CollectiveError naming the call."""

    def __init__(self, group, peer: int):
        if group.world_size < 2:
            raise ValueError(f"TorchDistributed: the group has {group.world_size} rank; the hand-off needs two "
                             f"(nwor_lab.disagg.run_handoff starts them)")
        if not 0 <= peer < group.world_size or peer == group.rank:
            raise ValueError(f"peer={peer}: another rank of 0..{group.world_size - 1}, not {group.rank}")
        self.group, self.peer = group, peer
        self.name = group.backend
        self.bytes_sent = 0

    def _send(self, what: str, t: torch.Tensor) -> None:
        import torch.distributed as dist
        self.group._run(f"send ({what})", lambda: dist.send(t, self.peer, group=self.group.process_group))

    def _recv(self, what: str, t: torch.Tensor) -> None:
        import torch.distributed as dist
        self.group._run(f"recv ({what})", lambda: dist.recv(t, self.peer, group=self.group.process_group))

    def send(self, shipment: Shipment) -> None:
        """The frame (header, host tensors, the rows' manifest), then each row tensor from the group's
        device (a row elsewhere is copied there first: under NCCL export with `on_device=True`)."""
        dev = self.group.device
        rows = {n: t for n, t in shipment.tensors.items() if n.startswith(ROW_PREFIXES)}
        header = dict(shipment.header)
        header[WIRE] = {"order": list(shipment.tensors),
                        "rows": [[n, str(t.dtype), list(t.shape)] for n, t in rows.items()]}
        small = {n: t for n, t in shipment.tensors.items() if n not in rows}
        frame = Shipment(header, small).encode().to(dev)
        self._send("hand-off length", torch.tensor([frame.numel()], dtype=torch.long, device=dev))
        self._send("hand-off frame", frame)
        sent = frame.numel()
        for name, t in rows.items():
            if t.numel():
                raw = t.detach().to(dev).contiguous().reshape(-1).view(torch.uint8)
                self._send(f"hand-off {name}", raw)
                sent += raw.numel()
        self.bytes_sent += sent

    def recv(self) -> Shipment:
        """-> the shipment, its rows on the group's device (the decode engine's: `install` assembles them there)."""
        dev = self.group.device
        size = torch.zeros(1, dtype=torch.long, device=dev)
        self._recv("hand-off length", size)
        frame = torch.empty(int(size), dtype=torch.uint8, device=dev)
        self._recv("hand-off frame", frame)
        small = Shipment.decode(frame)
        wire = small.header.pop(WIRE)
        tensors = dict(small.tensors)
        for name, dtype, shape in wire["rows"]:
            dtype = _DTYPES[dtype]
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            raw = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            if nbytes:
                self._recv(f"hand-off {name}", raw)
            tensors[name] = raw.view(dtype).reshape(shape)
        return Shipment(small.header, {n: tensors[n] for n in wire["order"]})


def check_transport(name: str) -> str:
    if name not in TRANSPORTS:
        raise ValueError(f"transport={name!r}: choose one of {', '.join(TRANSPORTS)}")
    return name
