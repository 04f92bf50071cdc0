"""The two-process hand-off's rounds (nwor_lab.disagg.ranks.run_rounds) and the trace reading the GPU
profiles rest on (nwor_lab.bench.trace_profile), on the CPU:

- one pair of gloo processes runs a schedule of one-engine references and strategies, each round on
  fresh engines: every hand-off round decodes the reference's tokens, write_all ships more bytes than
  nwor on prompts with partial blocks, and the rows travel as their own messages (the NCCL path's
  wire, here on the CPU);
- the wire itself (a loopback in this process): bf16, fp8, float32 and empty rows come back bit for bit,
  in the frame's order, each row a raw message of its own;
- the profiled round's trace holds the receive and the decode ranges, one after the other;
- the trace helpers on planted events: device work attributed to the range that launched it, overlap
  of device intervals, host syncs named with the range holding them (what a CUDA trace carries; the
  GPU runs are tests/gpu/today_run.sh's);
- nccl without two GPUs, and bench disagg's repeats without two processes, are refused by name."""
import pytest
import torch

from nwor_lab.bench import trace_profile as tp
from nwor_lab.config import LabConfig
from nwor_lab.disagg import ONE_ENGINE, EnginePair, run_rounds

K, NEW = 3, 8


def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 16, (m,), generator=g).tolist() for m in (5, 9)]     # block size 4: partial blocks


def test_rounds_over_gloo_interleave_the_reference_and_the_strategies(tmp_path):
    pair = EnginePair("toy", 0, LabConfig(nwor_mode="off"),
                      (("k", K), ("num_blocks", 64), ("block_size", 4), ("temperature", 0.8), ("seed", 3)))
    trace = str(tmp_path / "decode.json")
    sched = [ONE_ENGINE, "nwor", "write_all", ONE_ENGINE]
    got = run_rounds(pair, prompts(), NEW, sched, transport="gloo", profile_round=1, profile_to=trace)
    ref = got[0]["token_ids"]
    assert got[3]["token_ids"] == ref and got[0]["prefill_s"] > 0
    nwor, write_all = got[1], got[2]
    assert nwor.token_ids == ref and write_all.token_ids == ref          # seeded T > 0: the stream travels
    assert nwor.transport == "gloo" and nwor.extra["rows_device"] == "cpu" and nwor.prefill_s > 0
    assert sum(write_all.kv_bytes) > sum(nwor.kv_bytes) and sum(write_all.junk_rows) > 0
    summary = tp.handoff_overlap(tp.load_trace(trace))
    assert summary["device"] is None and summary["host_overlap_us"] == 0 and summary["decode_host_us"] > 0


def test_nccl_needs_two_gpus():
    if torch.cuda.device_count() >= 2:
        pytest.skip("two GPUs here: tests/gpu/test_gpu_handoff_nccl.py runs the transport")
    with pytest.raises(ValueError, match="nccl.*GPU each"):
        run_rounds(EnginePair("toy"), [[1, 2, 3]], 4, ["nwor"], transport="nccl")


def test_bench_refuses_nccl_off_two_gpus_and_repeats_in_process():
    from nwor_lab.bench.disagg import main
    from nwor_lab.commandline.errors import UsageError
    if torch.cuda.device_count() < 2:
        with pytest.raises(UsageError, match="nccl.*GPU each"):
            main(["--model", "8b-mini", "--device", "cpu", "--transport", "nccl"])
    with pytest.raises(UsageError, match="two-process"):
        main(["--model", "8b-mini", "--device", "cpu", "--repeats", "3"])


def test_bench_schedule_warms_every_item_then_interleaves():
    from nwor_lab.bench.disagg import schedule_for
    sched, reps = schedule_for(("nwor", "write_all"), warmup=1, repeats=2)
    assert sched == [ONE_ENGINE, "nwor", "write_all", ONE_ENGINE, "nwor", "write_all", "write_all", "nwor", ONE_ENGINE]
    assert reps == [-1, -1, -1, 0, 0, 0, 1, 1, 1]


def planted():
    """A step range holding a launch, a kernel on stream 7 and a stream sync inside a named range; a
    copy on stream 9 launched outside it; a receive range whose kernel ends before the decode's starts."""
    rt = lambda name, ts, dur, corr: {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur,  # noqa: E731
                                      "args": {"correlation": corr}}
    dev = lambda cat, name, ts, dur, corr, s: {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,  # noqa: E731
                                               "args": {"correlation": corr, "stream": s}}
    ann = lambda name, ts, dur: {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}  # noqa: E731
    return [ann("nwor.step", 0, 100), ann("readback", 60, 30), ann("handoff.recv", 200, 20),
            ann("handoff.decode", 230, 50),
            rt("cudaLaunchKernel", 10, 2, 1), dev("kernel", "gemm", 20, 30, 1, 7),
            rt("cudaStreamSynchronize", 70, 15, 2), rt("cudaMemcpyAsync", 150, 1, 3),
            dev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 152, 40, 3, 9),
            rt("ncclRecv", 205, 1, 4), dev("kernel", "ncclDevKernel_SendRecv", 206, 40, 4, 11),
            rt("cudaLaunchKernel", 240, 1, 5), dev("kernel", "attention", 241, 20, 5, 7)]


def test_trace_helpers_on_planted_events():
    ev = planted()
    step = tp.ranges(ev, "nwor.step")
    assert step == [(0.0, 100.0)]
    assert [e["name"] for e in tp.launched_in(ev, step)] == ["gemm"]
    syncs = tp.host_syncs(ev, step, names=("readback",))
    assert syncs == {"cudaStreamSynchronize": {"count": 1, "us": 15.0, "in": {"readback": 1}}}
    assert tp.host_syncs(ev, [(140.0, 160.0)]) == {}                      # an async copy is not a sync
    assert set(tp.streams(tp.device_events(ev))) == {"7", "9", "11"}
    assert tp.overlap_us([(0, 10), (20, 30)], [(5, 25)]) == 10.0
    out = tp.handoff_overlap(ev)
    assert out["overlap_us"] == 5.0 and not out["transfer_ends_before_decode"]   # the planted kernel runs late
    assert out["transfer_kernels"] == ["ncclDevKernel_SendRecv"]


class LoopbackGroup:
    """A rank's group whose point-to-point messages go through a queue in this process (both ends here)."""
    world_size, rank, device, backend, process_group = 2, 0, torch.device("cpu"), "loopback", None

    def _run(self, what, fn):
        return fn()


def test_wire_sends_the_rows_as_raw_messages_in_any_dtype(monkeypatch):
    """The TorchDistributed wire (NCCL's on the GPU): the frame, then each row tensor as raw bytes; bf16
    and fp8 rows, an empty one, and the wire order come back bit for bit."""
    from collections import deque

    import torch.distributed as dist

    from nwor_lab.disagg import Shipment, TorchDistributed
    queue, sizes = deque(), []
    monkeypatch.setattr(dist, "send", lambda t, peer, group=None: (queue.append(t.clone()), sizes.append(t.numel())))
    monkeypatch.setattr(dist, "recv", lambda t, peer, group=None: t.copy_(queue.popleft()))
    g = torch.Generator().manual_seed(0)
    tensors = {"key.0": torch.randn(5, 2, 4, generator=g).to(torch.bfloat16),
               "generator": torch.arange(16, dtype=torch.uint8),
               "value.0": torch.randn(5, 2, 4, generator=g).to(torch.float8_e4m3fn),
               "state.conv": torch.zeros(0, 3), "key.1": torch.randn(5, 2, 4, generator=g)}
    link = TorchDistributed(LoopbackGroup(), peer=1)
    link.send(Shipment({"protocol": 1, "rows": 5}, tensors))
    got = link.recv()
    assert list(got.tensors) == list(tensors) and got.header == {"protocol": 1, "rows": 5}
    for name, t in tensors.items():
        assert got.tensors[name].dtype == t.dtype and got.tensors[name].shape == t.shape
        assert torch.equal(got.tensors[name].view(torch.uint8), t.view(torch.uint8)), name
    # length, frame, then key.0, value.0, key.1 (the empty state tensor sends nothing)
    assert sizes[2:] == [t.nbytes for n, t in tensors.items() if n.startswith(("key.", "value.")) and t.numel()]
    assert link.bytes_sent == sum(sizes[1:]) and not queue
