"""`nwor-lab bench state` on CPU at toy size (every strategy through the engine: rows, correctness,
declared against allocated bytes), the 8B hybrid shape's size, and the front ends of the state
strategy (`generate --state-mode`, the sweep's `state_mode`). Timings are not tested."""
import json

import pytest
import torch

from nwor_lab.bench import state as bench
from nwor_lab.cli.main import main as cli_main
from nwor_lab.state import STATE_POLICIES


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("state") / "state.json"
    res = bench.main(["--model", "toy", "--batch", "2", "--prompt-len", "4", "--new-tokens", "6", "--repeats", "1",
                      "--out", str(out)])
    return res, json.loads(out.read_text())


def test_one_row_per_strategy_with_the_documented_fields(toy):
    res, stored = toy
    rows = res["results"]
    assert stored["results"] == rows and stored["complete"]
    assert [r["strategy"] for r in rows] == list(STATE_POLICIES)
    for r in rows:
        for key in ("strategy", "model", "correct", "first_divergence", "state_bytes_steady", "state_bytes_window",
                    "tokens_per_s", "step_ms", "mean_acceptance_length", "batch", "k", "device", "torch"):
            assert key in r, key
        assert r["batch"] == 2 and r["k"] == 3 and r["device"].startswith("cpu")
        assert r["state_bytes_steady_checked"], r      # the declaration is what the engine allocated
        assert r["state_bytes_steady"] <= r["state_bytes_window"]


def test_off_diverges_and_every_other_strategy_equals_target_only(toy):
    rows = {r["strategy"]: r for r in toy[0]["results"]}
    off = rows.pop("off")
    assert not off["correct"] and not off["correct_greedy"] and isinstance(off["first_divergence"], int)
    for name, r in rows.items():
        assert r["correct"] and r["correct_greedy"] and r["sampled_equal"], name
        assert r["first_divergence"] is None and r["reference_strategy"] == "snapshots"
    # snapshots hold k + 1 rows for a request's life, the others one
    assert rows["snapshots"]["state_bytes_steady"] == 4 * rows["stage"]["state_bytes_steady"]
    # what a window held, measured, is within what the strategy declares (stage: its history slice)
    for name in ("cow", "replay", "stage"):
        assert rows[name]["state_bytes_steady"] < rows[name]["state_bytes_window_measured"] \
            <= rows[name]["state_bytes_window"], name


def test_forced_acceptance_rescoring_catches_off(monkeypatch):
    """Random weights, forced acceptance: the target's own tokens re-scored by a dense pass."""
    res = bench.main(["--model", "8b-hybrid-mini", "--batch", "2", "--k", "3", "--strategies", "off,stage",
                      "--prompt-len", "4", "--new-tokens", "8", "--repeats", "1", "--temperature", "0"])
    off, stage = res["results"]
    assert stage["correct"] and stage["max_logit_gap"] <= stage["tolerance"] and stage["target_tokens_checked"] > 0
    assert not off["correct"] and off["max_logit_gap"] > off["tolerance"] and off["first_divergence"] is not None


def test_the_8b_hybrid_shape_is_8b_class_and_3_to_1():
    from nwor_lab.model.hybrid import HybridConfig, HybridForCausalLM
    cfg = HybridConfig(**bench.HYBRID_SHAPES["8b-hybrid"])
    with torch.device("meta"):
        model = HybridForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert 7.5e9 < n < 9e9
    assert cfg.layer_types.count("linear_attention") == 3 * cfg.layer_types.count("full_attention")
    spec = model.state_spec(torch.bfloat16)
    assert spec.state_bytes_layer == 2 << 20 and spec.num_layers == 24


def test_bench_state_is_a_registered_bench_and_checks_its_flags(capsys):
    assert cli_main(["bench", "state", "--k", "0"]) == 2
    assert "--k" in capsys.readouterr().err
    assert cli_main(["bench", "state", "--model", "8b-hybrid", "--device", "cpu"]) == 2


def test_generate_takes_a_state_mode(capsys):
    from nwor_lab.commandline.generate_flags import parser
    assert parser().parse_args(["hi", "--state-mode", "replay"]).state_mode == "replay"
    assert parser().parse_args(["hi"]).state_mode is None
    assert cli_main(["generate", "hi", "--state-mode", "nope"]) == 2
    assert "--state-mode" in capsys.readouterr().err


def test_the_sweep_checks_state_mode_values():
    from nwor_lab.sweep.figures import declared_orders
    from nwor_lab.sweep.grid import SweepInputError, check_parameters, parse_grid
    declared = {"state_mode": "stage", "k": 4}
    check_parameters(parse_grid(["state_mode=off,snapshots,stage"]), {}, declared, "nb.ipynb")
    with pytest.raises(SweepInputError, match="state_mode='snapshot'"):
        check_parameters(parse_grid(["state_mode=off,snapshot"]), {}, declared, "nb.ipynb")
    with pytest.raises(SweepInputError, match="--set state_mode"):
        check_parameters({}, {"state_mode": "fast"}, declared, "nb.ipynb")
    assert declared_orders()["state_mode"][1:] == tuple(STATE_POLICIES)


def test_generate_runs_a_hybrid_checkpoint_under_the_state_mode(tmp_path, capsys, monkeypatch):
    import shutil
    from nwor_lab.model.loader import save_eagle, save_llama
    from nwor_lab.model.shipped import TINY_DIR
    monkeypatch.setitem(bench.HYBRID_SHAPES, "vocab", dict(bench.HYBRID_SHAPES["8b-hybrid-mini"], vocab_size=4096))
    target, head = bench.random_hybrid("vocab", "cpu", torch.float32)        # the shipped tokenizer's vocabulary
    save_llama(target, tmp_path)
    save_eagle(head, tmp_path / "eagle_config.json", tmp_path / "eagle.safetensors")
    shutil.copy(TINY_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    monkeypatch.delenv("NWOR_LAB_STATE_MODE", raising=False)
    assert cli_main(["generate", "def f():", "--checkpoint", str(tmp_path), "--state-mode", "replay", "--k", "3",
                     "--max-new-tokens", "5", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["state_mode"] == "replay" and len(got["token_ids"][0]) == 5


def test_vllm_generate_refuses_a_state_mode(capsys):
    """The vLLM front end shares generate's flags; its engine keeps no lab state store: refused, not ignored."""
    from nwor_lab.commandline.errors import run
    from nwor_lab.vllm.__main__ import cli_generate
    assert run(cli_generate, ["hi", "--state-mode", "stage"]) == 2
    assert "--state-mode: not with --engine vllm" in capsys.readouterr().err
