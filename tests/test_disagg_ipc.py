"""The CUDA IPC transport's CPU side (the transport itself needs a GPU: tests/gpu/test_gpu_handoff_ipc.py):
what it sends is exported with its rows left on the engine's device and installed there, and that
path decodes one engine's tokens; `cuda_ipc` is a transport setting, refused by name off CUDA (the
function and the bench); `bench disagg --model 8b-mini` runs the 8B path at toy size."""
import json

import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.disagg import TRANSPORTS, EnginePair, InProcess, decode, prefill, run_handoff
from nwor_lab.engine import SpecEngine
from nwor_lab.model.toy import toy_pair


def test_rows_left_on_the_device_decode_one_engines_tokens():
    t, h = toy_pair(0)
    make = lambda: SpecEngine(t, h, LabConfig(nwor_mode="off"), k=3, num_blocks=64, block_size=4,   # noqa: E731
                              max_num_seqs=4, temperature=0.8, seed=3)
    g = torch.Generator().manual_seed(1)
    ps = [torch.randint(0, 16, (m,), generator=g).tolist() for m in (5, 9, 2)]
    ref = make()
    reqs = [ref.add_request(p, 10) for p in ps]
    ref.run()
    shipped = prefill(make(), ps, 10, "nwor", on_device=True)
    assert all(not x.tensors["key.0"]._is_view() for x in shipped)       # owned copies, not views of the cache
    link = InProcess()
    for s in shipped:
        link.send(s)
    assert decode(make(), [link.recv() for _ in shipped]) == [r.output for r in reqs]


def test_cuda_ipc_is_a_setting_refused_off_cuda():
    assert "cuda_ipc" in TRANSPORTS
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the transport itself (tests/gpu)")
    with pytest.raises(ValueError, match="cuda_ipc.*CUDA"):
        run_handoff(EnginePair("toy"), [[1, 2, 3]], 4, transport="cuda_ipc")


def test_bench_refuses_cuda_ipc_on_the_cpu_and_runs_the_8b_path_at_toy_size(tmp_path, capsys):
    from nwor_lab.bench.disagg import main
    from nwor_lab.commandline.errors import UsageError
    with pytest.raises((UsageError, SystemExit)):
        main(["--model", "8b-mini", "--device", "cpu", "--transport", "cuda_ipc"])
    out = tmp_path / "d.json"
    res = main(["--model", "8b-mini", "--device", "cpu", "--strategies", "nwor,write_all", "--nwor", "off",
                "--prompts", "2", "--prompt-len", "20", "--max-new-tokens", "6", "--k", "3", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert res["device"] == "cpu" and [r["strategy"] for r in rows] == ["one engine", "nwor", "write_all"]
    assert all(r["tokens_equal_one_engine"] for r in rows[1:])
    assert rows[2]["kv_bytes"] > rows[1]["kv_bytes"] and rows[2]["junk_rows"] > 0
