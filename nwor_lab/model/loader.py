"""Checkpoint loaders: Hugging Face Llama directories and EAGLE-1 heads (published key layout).

Llama directory: `config.json`, weights in `model.safetensors` or shards listed in
`model.safetensors.index.json` (`weight_map`), optional `tokenizer.json`.
EAGLE-1 head: a Llama `config.json` with `num_hidden_layers: 1` and weights `fc.weight`
(`fc.bias` optional), `layers.0.*`, `embed_tokens.weight` optional (else the target's is used).
EAGLE-3 head (recognised by `midlayer.*` or `d2t`): `fc.weight` [h, 3h], `midlayer.*`,
`norm.weight`, `lm_head.weight` [draft vocab, h], `d2t`; `t2d` ignored; aux layers from
`eagle_config.eagle_aux_hidden_state_layer_ids`, else (2, N // 2, N - 3).
A `model.` prefix on every key (some conversions add it) is accepted.
Weights are stored in any float dtype (the shipped pair: bf16) and cast to the requested dtype.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from nwor_lab import atomic
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.eagle import EagleHead
from nwor_lab.model.eagle3 import Eagle3Head, default_aux_layers
from nwor_lab.model.llama import LlamaForCausalLM

# Keys some checkpoints carry that the lab recomputes or does not use.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint does not match the model it is loaded into (keys, shapes, sizes)."""


def read_json(path: Path, what: str) -> dict:
    """A JSON object from `path`, or a CheckpointError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file ({what})")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: cannot be read as JSON ({err}); the {what} is corrupt, restore it") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object ({what}), got {type(data).__name__}")
    return data


def read_config(path: Path) -> LlamaConfig:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no config.json (a Hugging Face checkpoint directory needs one)")
    try:
        data = read_json(path, "model config")
        if data.get("model_type") == "nwor_hybrid":     # the lab's hybrid (gated DeltaNet + attention)
            from nwor_lab.model.hybrid import HybridConfig
            return HybridConfig.from_dict(data)
        return LlamaConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"{path}: {err}") from err


def read_safetensors(path) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, or a CheckpointError naming the file (the library's own
    errors, e.g. "header too large", do not)."""
    from safetensors import SafetensorError

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: not a readable safetensors file ({why}); the file is corrupt "
                              f"or truncated, restore it") from err


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of `model.safetensors`, or of the shards named by `model.safetensors.index.json`."""
    directory = Path(directory)
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors(single)
    if index.is_file():
        weight_map = read_json(index, "shard index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map object (a sharded checkpoint's index needs one)")
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors = read_safetensors(directory / shard)
            out.update({k: v for k, v in tensors.items() if weight_map.get(k) == shard})
        missing = sorted(set(weight_map) - set(out))
        if missing:
            raise CheckpointError(f"{index}: keys {missing[:4]} are listed but not in their shards")
        return out
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such checkpoint directory")
    raise CheckpointError(f"{directory}: neither model.safetensors nor model.safetensors.index.json")


def load_state(module: torch.nn.Module, weights: dict[str, torch.Tensor], what: str,
               ignored: tuple = ()) -> None:
    """Copy `weights` into `module`, casting dtype; raise on unknown, missing or mis-shaped keys."""
    expected = module.state_dict()
    weights = {k: v for k, v in weights.items() if not k.endswith(IGNORED_SUFFIXES) and k not in ignored}
    unknown = sorted(set(weights) - set(expected))
    if unknown:
        raise CheckpointError(f"{what}: unknown keys {unknown[:6]}{' ...' if len(unknown) > 6 else ''}; "
                              f"expected names like {sorted(expected)[:3]}")
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise CheckpointError(f"{what}: missing keys {missing[:6]}{' ...' if len(missing) > 6 else ''}")
    for name, t in weights.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise CheckpointError(f"{what}: {name} has shape {tuple(t.shape)}, the config implies "
                                  f"{tuple(expected[name].shape)}")
    with torch.no_grad():
        for name, p in expected.items():
            p.copy_(weights[name].to(p.dtype))


def load_llama(directory, device="cpu", dtype=torch.float32) -> LlamaForCausalLM:
    """A Hugging Face Llama checkpoint directory -> `LlamaForCausalLM` in eval mode (a
    `HybridForCausalLM` when its config.json says `model_type` `nwor_hybrid`)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such checkpoint directory")
    cfg = read_config(directory / "config.json")
    weights = read_weights(directory)
    ignored = ("lm_head.weight",) if cfg.tie_word_embeddings else ()  # tied: the embedding is the head
    if type(cfg) is LlamaConfig:
        model = LlamaForCausalLM(cfg)
    else:
        from nwor_lab.model.hybrid import HybridForCausalLM
        model = HybridForCausalLM(cfg)
    load_state(model, weights, f"Llama checkpoint {directory}", ignored)
    return model.to(device=device, dtype=dtype).eval()


def load_eagle(config, weights, target: LlamaForCausalLM, device="cpu", dtype=torch.float32):
    """EAGLE-1 (`EagleHead`) or EAGLE-3 (`Eagle3Head`) head from a config (path or dict) and weights
    (path to .safetensors, a directory, or a dict), attached to `target`. Checks the head's hidden
    size against the target's first; the key layout says which EAGLE it is."""
    cfg = read_config(config) if not isinstance(config, dict) else LlamaConfig.from_dict(config)
    if cfg.hidden_size != target.config.hidden_size:
        raise CheckpointError(f"draft hidden_size {cfg.hidden_size} != target hidden_size "
                              f"{target.config.hidden_size}: this head was trained for another target")
    if isinstance(weights, (str, Path)):
        p = Path(weights)
        weights = read_weights(p) if p.is_dir() else read_safetensors(p)
    if weights and all(k.startswith("model.") for k in weights):
        weights = {k[len("model."):]: v for k, v in weights.items()}
    if is_eagle3(weights):
        return _load_eagle3(cfg, weights, target, device, dtype)
    head = EagleHead(cfg, fc_bias="fc.bias" in weights, own_embedding="embed_tokens.weight" in weights)
    # EAGLE-1's first layer has no input norm; some exports still carry its (unused) weight.
    load_state(head, weights, "EAGLE checkpoint", ignored=("layers.0.input_layernorm.weight",))
    return head.to(device=device, dtype=dtype).attach(target).eval()


def is_eagle3(weights: dict) -> bool:
    """EAGLE-3 checkpoints have `midlayer.*` (or a `d2t` map); EAGLE-1 has `layers.0.*`."""
    return "d2t" in weights or any(k.startswith("midlayer.") for k in weights)


def _load_eagle3(cfg: LlamaConfig, weights: dict, target, device, dtype) -> Eagle3Head:
    weights = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
               for k, v in weights.items()}
    aux = (cfg.extra.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    aux = tuple(aux) if aux else default_aux_layers(target.config.num_hidden_layers)
    draft_vocab = weights["lm_head.weight"].shape[0] if "lm_head.weight" in weights else cfg.vocab_size
    head = Eagle3Head(cfg, aux, draft_vocab, own_embedding="embed_tokens.weight" in weights)
    load_state(head, weights, "EAGLE-3 checkpoint", ignored=("t2d",))
    target_ids = torch.arange(head.draft_vocab_size) + head.d2t
    if head.draft_vocab_size and not bool(((target_ids >= 0) & (target_ids < cfg.vocab_size)).all()):
        raise CheckpointError(f"EAGLE-3 checkpoint: d2t maps draft ids outside the target vocabulary "
                              f"(0..{cfg.vocab_size - 1})")
    try:
        head.attach(target)
    except ValueError as err:
        raise CheckpointError(f"EAGLE-3 checkpoint: {err}") from None
    return head.to(device=device, dtype=dtype).eval()


def load_tokenizer(path):
    from tokenizers import Tokenizer
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: no tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception for a bad file
        raise CheckpointError(f"{path}: not a readable tokenizer.json ({err}); the file is corrupt, "
                              f"restore it") from err


def save_llama(model: LlamaForCausalLM, directory, dtype=torch.bfloat16) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    atomic.write_text(directory / "config.json", json.dumps(cfg, indent=1))
    with atomic.staged_path(directory / "model.safetensors") as tmp:       # never a half-written checkpoint
        save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}, tmp)


def save_eagle(head, config_path, weights_path, dtype=torch.bfloat16) -> None:
    """EAGLE-1 or EAGLE-3 head -> config.json-style file + safetensors (d2t kept as int64)."""
    cfg = head.config.to_dict()
    cfg.update(architectures=["EagleLlamaForCausalLM"], torch_dtype=str(dtype).replace("torch.", ""))
    if isinstance(head, Eagle3Head):
        cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=head.draft_vocab_size,
                   eagle_config={"eagle_aux_hidden_state_layer_ids": list(head.aux_layers)})
    atomic.write_text(config_path, json.dumps(cfg, indent=1))
    with atomic.staged_path(weights_path) as tmp:
        save_file({k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
                   for k, v in head.state_dict().items()}, tmp)
