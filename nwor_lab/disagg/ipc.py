"""The hand-off between two processes on one GPU through CUDA IPC (`transport="cuda_ipc"`): the
transport for one card, where NCCL needs a GPU per engine.

    run_ipc_handoff(pair, prompts, max_new_tokens, strategy, device="cuda:0") -> HandoffResult
                                       (nwor_lab.disagg.handoff: the two ranks; this module: `CudaIpc`)

Both ranks build their engine on the same `device`. The prefill rank exports each request with its
K/V rows and state left on the GPU (`export_request(..., on_device=True)`), and sends, over a gloo
group on the CPU (the control channel: nwor_lab.distributed.launch), the header and, per tensor,
a CUDA IPC handle (`torch.multiprocessing.reductions.reduce_tensor`: the storage's cudaIpcMemHandle,
offset, shape and an event the producer recorded after its last write). Host-side tensors (the
sampler's state, draft probabilities, fp8 scales) go in the same message as bytes. The decode rank
opens each handle (the producer's memory mapped into its address space; its stream waits on the
producer's event, no host sync), clones the rows into memory of its own on the same GPU, waits for
the clones, and acknowledges; only then does the prefill rank drop its references (the producer
must outlive every consumer of a CUDA IPC allocation). `install` then assembles the rows on the GPU
and the swap-in path copies them into the decode engine's fresh blocks: device to device, no host
copy of the K/V on the way.

Unverified here: written on a machine without a GPU. tests/gpu/test_gpu_handoff_ipc.py runs it on
one card (tokens equal one engine's, greedy and seeded T > 0); tests/gpu/disagg_run.sh benches it
on the Llama-3-8B shape. On the CPU `run_ipc_handoff` is refused by name (CUDA IPC needs CUDA).
"""
from __future__ import annotations

import pickle

import torch

from nwor_lab.disagg.shipment import Shipment


class CudaIpc:
    """Shipments between this rank and `peer` of a gloo `group`, their CUDA tensors by IPC handle
    (same GPU, two processes). `send` blocks until the peer has its own copy of every tensor."""

    name = "cuda_ipc"

    def __init__(self, group, peer: int):
        if group.world_size < 2 or not 0 <= peer < group.world_size or peer == group.rank:
            raise ValueError(f"CudaIpc: peer={peer} must be another rank of the group (world size "
                             f"{group.world_size}, this rank {group.rank})")
        self.group, self.peer = group, peer
        self.bytes_sent = 0          # the shipments' bytes (what the GPU memory holds, header included)
        self.control_bytes = 0       # what went over the control channel (handles, header, host tensors)

    # the control channel: length-prefixed bytes over the gloo group
    def _send_bytes(self, data: bytes) -> None:
        import torch.distributed as dist
        pg = self.group.process_group
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        size = torch.tensor([buf.numel()], dtype=torch.long)
        self.group._run("send (ipc length)", lambda: dist.send(size, self.peer, group=pg))
        self.group._run("send (ipc message)", lambda: dist.send(buf, self.peer, group=pg))
        self.control_bytes += buf.numel() + 8

    def _recv_bytes(self) -> bytes:
        import torch.distributed as dist
        pg = self.group.process_group
        size = torch.zeros(1, dtype=torch.long)
        self.group._run("recv (ipc length)", lambda: dist.recv(size, self.peer, group=pg))
        buf = torch.empty(int(size), dtype=torch.uint8)
        self.group._run("recv (ipc message)", lambda: dist.recv(buf, self.peer, group=pg))
        return buf.numpy().tobytes()

    def send(self, shipment: Shipment) -> None:
        from torch.multiprocessing.reductions import reduce_tensor
        handles, host, keep = {}, {}, []       # keep: the shared tensors, alive until the peer has cloned them
        for name, t in shipment.tensors.items():
            if t.device.type == "cuda":
                keep.append(t.contiguous())
                handles[name] = reduce_tensor(keep[-1])
            else:
                host[name] = t
        buf = {"header": shipment.header, "order": list(shipment.tensors), "handles": handles,
               "host": {n: (str(t.dtype), list(t.shape), t.contiguous().view(torch.uint8).numpy().tobytes())
                        for n, t in host.items()}}
        self._send_bytes(pickle.dumps(buf))
        if self._recv_bytes() != b"ok":
            raise RuntimeError("CudaIpc.send: the decode rank did not acknowledge the shipment")
        del keep
        self.bytes_sent += shipment.nbytes

    def recv(self) -> Shipment:
        from nwor_lab.disagg.shipment import _DTYPES
        msg = pickle.loads(self._recv_bytes())
        tensors = {}
        for name, (rebuild, args) in msg["handles"].items():
            tensors[name] = rebuild(*args).clone()     # the producer's memory, mapped; copied into ours
        for name, (dtype, shape, raw) in msg["host"].items():
            tensors[name] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(_DTYPES[dtype]).reshape(shape)
        if msg["handles"]:
            torch.cuda.current_stream().synchronize()  # the clones are done: the producer may free
        self._send_bytes(b"ok")
        return Shipment(msg["header"], {n: tensors[n] for n in msg["order"]})
