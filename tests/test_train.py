"""The training script's loops run on CPU at toy scale and actually learn (loss goes down)."""
import numpy as np

from nwor_lab.model.config import LlamaConfig
from nwor_lab.train.loop import train_eagle3, train_head, train_target

TOY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
           max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)


def _data(n, seed):
    """A learnable stream: a fixed random cycle of 40 tokens, so next-token loss can fall far."""
    cycle = np.random.default_rng(0).permutation(64)[:40].astype(np.uint16)
    start = np.random.default_rng(seed).integers(0, 40)
    return np.resize(np.roll(cycle, start), n)


def test_target_head_and_eagle3_training_loops_learn():
    logs = []
    cfg = LlamaConfig.from_dict(TOY)
    train, evald = _data(20000, 1), _data(4000, 2)
    common = dict(batch_size=8, seq=32, device="cpu", log=logs.append, warmup=5)
    target, t_stats = train_target(cfg, train, evald, steps=60, lr=3e-3, **common)
    assert t_stats["steps"] == 60 and t_stats["eval_loss"] < np.log(64) * 0.5, t_stats
    head_cfg = LlamaConfig.from_dict({**TOY, "num_hidden_layers": 1})
    _, h_stats = train_head(target, head_cfg, train, evald, steps=20, lr=3e-3, **common)
    _, e_stats = train_eagle3(target, head_cfg, train, evald, draft_vocab_size=48, steps=20, lr=3e-3, **common)
    for stats in (h_stats, e_stats):
        assert stats["steps"] == 20 and np.isfinite(stats["eval_loss"])
    assert any(line.startswith("head step 1 ") for line in logs)
    assert any(line.startswith("eagle3 step 20 ") for line in logs)


def test_train_command_end_to_end_at_toy_scale(tmp_path):
    """`python -m nwor_lab.train corpus` then `pair`, tiny: files written, log says what ran.
    Subprocesses: the tokenizer trainer's thread pool would slow later tests in this process."""
    import json
    import subprocess
    import sys
    run = lambda *a: subprocess.run([sys.executable, "-m", "nwor_lab.train", *a], check=True,  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    run("corpus", "--limit-files", "6", "--vocab-size", "300", "--out", str(tmp_path / "c"))
    cfg = json.dumps({"vocab_size": 300, "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                      "head_dim": 16})
    run("pair", "--data", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--device", "cpu", "--config", cfg,
        "--target-steps", "2", "--head-steps", "2", "--batch", "2", "--seq", "16", "--eval-prompts", "1",
        "--eval-new-tokens", "4")
    names = {p.name for p in (tmp_path / "o").iterdir()}
    assert {"model.safetensors", "eagle.safetensors", "tokenizer.json", "train_log.json"} <= names
    log = json.loads((tmp_path / "o" / "train_log.json").read_text())
    assert log["stats"]["target"]["steps"] == 2 and log["stats"]["head"]["steps"] == 2


def test_hybrid_target_and_its_head_learn():
    """`pair --hybrid`'s loops: the gated DeltaNet + attention target (its dense forward is the
    torch chunked form) and an EAGLE-1 head for it train on CPU and learn."""
    from nwor_lab.model.hybrid import HybridConfig, HybridForCausalLM
    logs = []
    cfg = HybridConfig.from_dict({**TOY, "num_hidden_layers": 4, "linear_num_key_heads": 1,
                                  "linear_num_value_heads": 2, "linear_key_head_dim": 16,
                                  "linear_value_head_dim": 16})
    train, evald = _data(20000, 1), _data(4000, 2)
    common = dict(batch_size=8, seq=32, device="cpu", log=logs.append, warmup=5)
    target, t_stats = train_target(cfg, train, evald, steps=40, lr=3e-3, **common)
    assert isinstance(target, HybridForCausalLM) and t_stats["eval_loss"] < np.log(64) * 0.5, t_stats
    assert target.model.layers[0].linear_attn.dt_bias.abs().min() > 0       # the decay init survived
    head_cfg = LlamaConfig.from_dict({**cfg.to_dict(), "num_hidden_layers": 1})
    _, h_stats = train_head(target, head_cfg, train, evald, steps=10, lr=3e-3, **common)
    assert h_stats["steps"] == 10 and np.isfinite(h_stats["eval_loss"])
