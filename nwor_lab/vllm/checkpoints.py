"""The shipped pair as folders vLLM loads: `prepare(root)` -> target, EAGLE-1 and EAGLE-3 dirs.

vLLM reads a model from a folder holding `config.json` and its safetensors. The lab ships one
folder with the target and both heads side by side (nwor_lab/checkpoints/tiny), so each vLLM
folder links the shipped weight files (no copy) and gets its own config.json:

    <root>/target/   config.json, model.safetensors, tokenizer.json     (the Llama as shipped)
    <root>/eagle/    config.json (architectures: EagleLlamaFcBiasForCausalLM), model.safetensors
    <root>/eagle3/   config.json (as shipped: LlamaForCausalLMEagle3), model.safetensors

The EAGLE-1 folder names the plugin's head class, which keeps `fc.bias` (eagle_head.py); with
`keep_fc_bias=False` it names vLLM's own (`EagleLlamaForCausalLM`), which drops it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from nwor_lab.model.shipped import TINY_DIR
from nwor_lab.vllm.names import EAGLE1_ARCH

FILES = {"target": ("config.json", "model.safetensors", "tokenizer.json"),
         "eagle": ("eagle_config.json", "eagle.safetensors"),
         "eagle3": ("eagle3_config.json", "eagle3.safetensors")}


def default_root() -> Path:
    base = os.environ.get("NWOR_LAB_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nwor_lab")
    return Path(base) / "vllm-models"


def prepare(root: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
            keep_fc_bias: bool = True) -> dict[str, Path]:
    """Write (or refresh) the three folders under `root`; returns {"target", "eagle", "eagle3"} -> path."""
    src = Path(source or TINY_DIR)
    root = Path(root or default_root()) / ("tiny" if keep_fc_bias else "tiny-vllm-eagle1")
    out = {}
    for name, files in FILES.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        config = json.loads((src / files[0]).read_text())
        if name == "eagle":
            config["architectures"] = [EAGLE1_ARCH if keep_fc_bias else "EagleLlamaForCausalLM"]
        _write_if_changed(folder / "config.json", json.dumps(config, indent=1))
        for f in files[1:]:
            target = folder / ("model.safetensors" if f.endswith(".safetensors") else f)
            _link(src / f, target)
        out[name] = folder
    return out


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def _link(src: Path, dst: Path) -> None:
    src = src.resolve()
    if dst.is_symlink() and Path(os.readlink(dst)) == src:
        return
    if not src.exists():
        raise FileNotFoundError(f"{src}: the shipped checkpoint file is missing; reinstall nwor_lab")
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists() or tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(src)
    os.replace(tmp, dst)
