"""Fetch vLLM's pinned wheel once, check its hash, extract the files the contract test reads.

    fetch() -> Path | str      the extracted source root, or the reason it is unavailable

Cache: $NWOR_LAB_VLLM_WHEEL_DIR, default ~/.cache/nwor_lab/vllm-wheel (shared by every run on a
machine). The wheel (336 MB) is downloaded with `pip download --no-deps` for the exact platform
tag it was pinned with, whatever machine runs the test, and kept; only the files below are
extracted, into `vllm-<version>-src/`, written to a temporary directory and renamed into place so
a concurrent or interrupted run never sees half a tree.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.33.0"
WHEEL = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
SHA256 = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
DOWNLOAD_TIMEOUT_S = 900

# Everything the contract reads from the wheel (loader.py imports the .py modules).
FILES = (
    "vllm/v1/spec_decode/metadata.py",
    "vllm/v1/worker/gpu_model_runner.py",       # _calc_spec_decode_metadata, _get_cumsum_and_arange (by ast)
    "vllm/utils/torch_utils.py",                # async_tensor_h2d (by ast)
    "vllm/v1/sample/rejection_sampler.py",
    "vllm/v1/sample/sampler.py",
    "vllm/v1/sample/metadata.py",
    "vllm/v1/sample/ops/topk_topp_sampler.py",
    "vllm/v1/sample/ops/bad_words.py",
    "vllm/v1/spec_decode/fly.py",
    "vllm/model_executor/warmup/jit_warmup.py",
    "vllm/model_executor/warmup/jit_warmup_triton_helper.py",
)


def cache_dir() -> Path:
    return Path(os.environ.get("NWOR_LAB_VLLM_WHEEL_DIR") or Path.home() / ".cache" / "nwor_lab" / "vllm-wheel")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(dest: Path) -> str | None:
    """pip download the pinned wheel into dest; None on success, else the reason."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--platform", "manylinux_2_28_x86_64", "--python-version", "3.12", "--implementation", "cp",
           "--abi", "abi3", "--disable-pip-version-check", "-q", "-d", str(dest), f"vllm=={VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"pip download vllm=={VERSION} failed: {type(err).__name__}: {err}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return f"pip download vllm=={VERSION} exited {proc.returncode}: {tail[0]}"
    return None


def fetch() -> Path | str:
    """The extracted source root (contains `vllm/`), or a one-line reason why it is unavailable."""
    root = cache_dir()
    src = root / f"vllm-{VERSION}-src"
    if (src / ".complete").is_file() and (src / ".complete").read_text().strip() == SHA256:
        return src
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot create the wheel cache {root}: {err} (set NWOR_LAB_VLLM_WHEEL_DIR)"
    wheel = root / WHEEL
    if not wheel.is_file():
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            reason = _download(Path(tmp))
            if reason:
                return reason
            got = Path(tmp) / WHEEL
            if not got.is_file():
                return f"pip download did not produce {WHEEL} (got {sorted(p.name for p in Path(tmp).iterdir())})"
            os.replace(got, wheel)
    digest = _sha256(wheel)
    if digest != SHA256:
        wheel.unlink(missing_ok=True)
        return f"{WHEEL}: sha256 {digest[:16]}... is not the pinned {SHA256[:16]}... (deleted; the next run refetches)"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".extract-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for name in FILES:
                zf.extract(name, tmp)
        (tmp / ".complete").write_text(SHA256 + "\n")
        tmp.chmod(0o755)                          # the cache may be shared by several users
        if src.exists() and not (src / ".complete").is_file():
            shutil.rmtree(src, ignore_errors=True)  # an old or broken tree, never a finished one
        os.rename(tmp, src)                       # fails if a concurrent run finished first
    except (OSError, KeyError, zipfile.BadZipFile) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if (src / ".complete").is_file():
            return src
        return f"extracting {WHEEL} failed: {type(err).__name__}: {err}"
    return src
