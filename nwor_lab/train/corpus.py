"""The training corpus: the Python interpreter's own standard-library sources.

Exact choice: every `*.py` file under `sysconfig.get_paths()["stdlib"]` (CPython 3.11.7 for the
shipped pair), `site-packages/` excluded, sorted by relative path, read as UTF-8 (bad bytes
replaced). A file is HELD OUT for evaluation when any part of its relative path mentions one of
`HELD_OUT` (so `json/decoder.py` and `test/test_json/test_dump.py` are both held out).
Documents are joined with the `<|endoftext|>` token, which also starts each document.
"""
from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

from nwor_lab import atomic

HELD_OUT = ("json", "email", "argparse", "textwrap", "difflib", "heapq", "fractions", "calendar", "shlex")
EOT = "<|endoftext|>"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = Path(root or stdlib_root())
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts)


def is_held_out(rel: Path) -> bool:
    return any(name in part for part in rel.parts for name in HELD_OUT)


def split(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train files, held-out files), each sorted."""
    root = Path(root or stdlib_root())
    train, held = [], []
    for p in stdlib_files(root):
        (held if is_held_out(p.relative_to(root)) else train).append(p)
    return train, held


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def encode_files(tokenizer, files: list[Path]) -> np.ndarray:
    """uint16 token ids, each document prefixed with `<|endoftext|>`."""
    eot = tokenizer.token_to_id(EOT)
    out = []
    for start in range(0, len(files), 256):
        batch = [read(p) for p in files[start:start + 256]]
        for enc in tokenizer.encode_batch(batch):
            out.append(np.asarray([eot] + enc.ids, dtype=np.uint16))
    return np.concatenate(out)


def pack(tokenizer, out_dir: Path, root: Path | None = None, limit_files: int | None = None) -> dict:
    """Write `train.bin`, `eval.bin` (uint16) and `corpus.json` (what was used) into out_dir."""
    root = Path(root or stdlib_root())
    train, held = split(root)
    if limit_files:
        train, held = train[:limit_files], held[:max(1, limit_files // 8)]
    out_dir.mkdir(parents=True, exist_ok=True)
    tr, ev = encode_files(tokenizer, train), encode_files(tokenizer, held)
    tr.tofile(out_dir / "train.bin")
    ev.tofile(out_dir / "eval.bin")
    info = {"python": sys.version.split()[0], "stdlib": str(root), "held_out_names": list(HELD_OUT),
            "train_files": len(train), "eval_files": len(held), "train_tokens": int(tr.size),
            "eval_tokens": int(ev.size), "eval_file_list": [str(p.relative_to(root)) for p in held]}
    atomic.write_text(out_dir / "corpus.json", json.dumps(info, indent=1))
    return info
