"""Loaders on tiny synthetic checkpoints written here: HF Llama (single and sharded), EAGLE-1
heads in the published key layout, tokenizer.json; and the errors for bad checkpoints."""
import json

import pytest
import torch
from safetensors.torch import save_file

from nwor_lab.model import CheckpointError, load_eagle, load_llama, load_tokenizer, save_eagle, save_llama
from nwor_lab.model.toy import toy_config, toy_pair


def hf_dir(tmp_path, target, sharded=False):
    d = tmp_path / "llama"
    save_llama(target, d, dtype=torch.float32)
    if sharded:
        sd = {k: v.contiguous() for k, v in target.state_dict().items()}
        names = sorted(sd)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for shard, keys in shards.items():
            save_file({k: sd[k] for k in keys}, str(d / shard))
        (d / "model.safetensors").unlink()
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}))
    return d


@pytest.mark.parametrize("sharded", [False, True])
def test_llama_roundtrip(tmp_path, sharded):
    target, _ = toy_pair(0)
    d = hf_dir(tmp_path, target, sharded)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_key_value_heads"] == 2
    loaded = load_llama(d)
    for k, v in target.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_llama_bf16_weights_upcast(tmp_path):
    target, _ = toy_pair(0)
    save_llama(target, tmp_path, dtype=torch.bfloat16)
    loaded = load_llama(tmp_path, dtype=torch.float32)
    w = loaded.model.embed_tokens.weight
    assert w.dtype == torch.float32
    assert torch.equal(w, target.model.embed_tokens.weight.to(torch.bfloat16).float())


def test_llama_config_extras_and_eos_list(tmp_path):
    target, _ = toy_pair(0)
    save_llama(target, tmp_path, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(eos_token_id=[3, 4], hidden_act="silu", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_llama(tmp_path)
    assert m.config.eos_token_id == 3 and m.config.extra["hidden_act"] == "silu"


def test_unknown_key_is_an_error(tmp_path):
    target, _ = toy_pair(0)
    d = hf_dir(tmp_path, target)
    sd = dict(target.state_dict())
    sd["model.layers.0.self_attn.bogus.weight"] = torch.zeros(2)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unknown keys.*bogus"):
        load_llama(d)


def test_missing_key_is_an_error(tmp_path):
    target, _ = toy_pair(0)
    d = hf_dir(tmp_path, target)
    sd = {k: v.contiguous() for k, v in target.state_dict().items() if k != "model.norm.weight"}
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing keys.*model.norm.weight"):
        load_llama(d)


def test_shape_mismatch_is_an_error(tmp_path):
    target, _ = toy_pair(0)
    d = hf_dir(tmp_path, target)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] += 4
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="mlp.*shape"):
        load_llama(d)


def test_missing_files_are_errors(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_llama(tmp_path)
    target, _ = toy_pair(0)
    save_llama(target, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors"):
        load_llama(tmp_path)


def eagle_files(tmp_path, head, extra=None, drop=(), prefix=""):
    save_eagle(head, tmp_path / "eagle.json", tmp_path / "tmp.safetensors", dtype=torch.float32)
    sd = {prefix + k: v.contiguous() for k, v in head.state_dict().items() if k not in drop}
    sd.update(extra or {})
    save_file(sd, str(tmp_path / "eagle.safetensors"))
    return tmp_path / "eagle.json", tmp_path / "eagle.safetensors"


def test_eagle_published_layout(tmp_path):
    target, head = toy_pair(0)
    keys = sorted(head.state_dict())
    assert "fc.weight" in keys and "fc.bias" in keys and "layers.0.self_attn.q_proj.weight" in keys
    assert "layers.0.input_layernorm.weight" not in keys          # EAGLE-1: no input norm in layer 0
    h = target.config.hidden_size
    cfg, w = eagle_files(tmp_path, head, extra={"embed_tokens.weight": target.model.embed_tokens.weight.clone(),
                                                "layers.0.input_layernorm.weight": torch.ones(h)})
    loaded = load_eagle(cfg, w, target)
    assert loaded.embed_tokens is not None and loaded.fc.bias is not None
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # "model." prefixed keys, no fc bias, shared embedding
    cfg, w = eagle_files(tmp_path, head, drop=("fc.bias",), prefix="model.")
    loaded = load_eagle(cfg, w, target)
    assert loaded.fc.bias is None and loaded.embed_tokens is None


def test_eagle_errors(tmp_path):
    target, head = toy_pair(0)
    cfg, w = eagle_files(tmp_path, head, extra={"layers.1.mlp.up_proj.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError, match="unknown keys.*layers.1"):
        load_eagle(cfg, w, target)
    other, _ = toy_pair(0, cfg=toy_config(hidden_size=48, num_attention_heads=4))
    cfg, w = eagle_files(tmp_path, head)
    with pytest.raises(CheckpointError, match="draft hidden_size 32 != target hidden_size 48"):
        load_eagle(cfg, w, other)
    bad = json.loads(cfg.read_text())
    bad["intermediate_size"] = 8
    with pytest.raises(CheckpointError, match="shape"):
        load_eagle(bad, w, target)


def test_tokenizer_json(tmp_path):
    # Built, not trained: training starts tokenizers' thread pool, which then starves torch of the
    # CPU for the rest of the test session.
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<|endoftext|>": 0, "d": 1, "e": 2, "f": 3, "Ġ": 4, "de": 5, "def": 6}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("d", "e"), ("de", "f")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode("def fed").ids == tok.encode("def fed").ids == [6, 4, 3, 2, 1]
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "nope")


def test_eagle3_published_layout(tmp_path):
    from nwor_lab.model import Eagle3Head
    from nwor_lab.model.toy import toy_eagle3
    target, _ = toy_pair(0, cfg=toy_config(num_hidden_layers=4))
    head = toy_eagle3(target, aux_layers=(0, 2, 3), draft_vocab_size=8)
    keys = set(head.state_dict())
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight",
            "lm_head.weight", "d2t"} <= keys
    save_eagle(head, tmp_path / "eagle3.json", tmp_path / "eagle3.safetensors", dtype=torch.float32)
    cfg = json.loads((tmp_path / "eagle3.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3] and cfg["draft_vocab_size"] == 8
    loaded = load_eagle(tmp_path / "eagle3.json", tmp_path / "eagle3.safetensors", target)
    assert isinstance(loaded, Eagle3Head) and loaded.aux_layers == (0, 2, 3)
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # `layers.0.*` alias, a t2d map (ignored), default aux layers when the config has none
    sd = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
          for k, v in head.state_dict().items()}
    sd["t2d"] = torch.zeros(16, dtype=torch.bool)
    del cfg["eagle_config"]
    loaded = load_eagle(cfg, sd, target)
    assert loaded.aux_layers == (2, 2, 1)


def test_eagle3_errors(tmp_path):
    from nwor_lab.model.toy import toy_eagle3
    target, _ = toy_pair(0, cfg=toy_config(num_hidden_layers=4))
    head = toy_eagle3(target)
    sd = dict(head.state_dict())
    cfg = json.loads(json.dumps({**head.config.to_dict(), "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 7]}}))
    with pytest.raises(CheckpointError, match="aux_layers"):
        load_eagle(cfg, sd, target)
    bad_map = dict(sd, d2t=torch.full((16,), 3))
    with pytest.raises(CheckpointError, match="d2t"):
        load_eagle(head.config.to_dict(), bad_map, target)
    sd["midlayer.self_attn.q_proj.weight"] = torch.zeros(32, 32)      # EAGLE-3 attention reads 2h
    with pytest.raises(CheckpointError, match="q_proj.*shape"):
        load_eagle(head.config.to_dict(), sd, target)
