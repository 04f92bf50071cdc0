"""How a shipment's frame travels from the prefill engine to the decode engine: one setting.

    inprocess  a queue in this process (tests, chapters): the same encode / decode as the wire
    gloo       torch.distributed point-to-point on CPU tensors, between two processes (the lab's
               launcher: nwor_lab.distributed.launch, a FileStore, a collective timeout)
    nccl       the same calls on CUDA tensors, where each engine has its own GPU. Not run here (no
               GPU on the machine this was written on): the calls are the gloo path's with the
               frame on the group's device; untested until a two-GPU run exercises them
    cuda_ipc   two processes sharing one GPU (the transport for one card): the K/V rows and state
               stay on the GPU and travel as CUDA IPC handles, the control messages over gloo
               (nwor_lab.disagg.ipc; GPU only)

Each frame goes as two messages: its length (`[1]` int64), then the frame (`[n]` uint8).
"""
from __future__ import annotations

from collections import deque

import torch

from nwor_lab.disagg.shipment import Shipment

TRANSPORTS = ("inprocess", "gloo", "nccl", "cuda_ipc")


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

    def send(self, shipment: Shipment) -> None:
        import torch.distributed as dist
        frame = shipment.encode().to(self.group.device)
        size = torch.tensor([frame.numel()], dtype=torch.long, device=self.group.device)
        self.group._run("send (hand-off length)", lambda: dist.send(size, self.peer, group=self.group.process_group))
        self.group._run("send (hand-off frame)", lambda: dist.send(frame, self.peer, group=self.group.process_group))
        self.bytes_sent += frame.numel()

    def recv(self) -> Shipment:
        import torch.distributed as dist
        size = torch.zeros(1, dtype=torch.long, device=self.group.device)
        self.group._run("recv (hand-off length)", lambda: dist.recv(size, self.peer, group=self.group.process_group))
        frame = torch.empty(int(size), dtype=torch.uint8, device=self.group.device)
        self.group._run("recv (hand-off frame)", lambda: dist.recv(frame, self.peer, group=self.group.process_group))
        return Shipment.decode(frame)


def check_transport(name: str) -> str:
    if name not in TRANSPORTS:
        raise ValueError(f"transport={name!r}: choose one of {', '.join(TRANSPORTS)}")
    return name
