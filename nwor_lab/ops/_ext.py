"""Build and load the CUDA extension in `csrc/` (`torch.ops.nwor_lab.*`), once, on demand.

Never runs at import. `load()` JIT-compiles with `torch.utils.cpp_extension.load` into a cache
directory keyed by package version, torch version and CUDA architecture list:

    ~/.cache/nwor_lab/ext/<version>-torch<torch version>-<arch list hash>/   (NWOR_LAB_CACHE_DIR)

Environment:
    NWOR_LAB_CACHE_DIR      cache root instead of ~/.cache/nwor_lab/ext
    NWOR_LAB_VERBOSE_BUILD  1 = show the compiler's commands and output
    NWOR_LAB_CSRC           the CUDA sources (default: csrc/ of the source checkout)
    TORCH_CUDA_ARCH_LIST    used when no GPU is visible (default then: "9.0", Hopper)
    CUDA_HOME               default /usr/local/cuda when unset and present

Concurrent builds (pytest-xdist workers, two notebooks) serialise on an `fcntl.flock` lock file
next to the build directory; the OS releases it when a process dies, so a killed build never
leaves the next one waiting. torch's own "baton" file (which a killed build does leave behind and
which makes the next `load` wait forever) is removed while we hold the lock.

A failed build raises `ExtensionBuildError` whose message carries the compiler's output.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from nwor_lab.lifeline import environment

NAME = "nwor_lab_ext"
CSRC = Path(os.environ.get("NWOR_LAB_CSRC") or Path(__file__).resolve().parents[2] / "csrc")
SOURCES = ("ops.cpp", "write_rows.cu", "slot_log.cu", "scv.cu")
OPS = ("write_kv", "log_slots", "restore_slots", "commit", "scv_mask", "noop")
EXTRA_CFLAGS = ["-O3"]
EXTRA_CUDA_CFLAGS = ["-O3", "-lineinfo"]  # line info for compute-sanitizer reports; no fast math (fp8 exactness)
DEFAULT_CPU_ARCH_LIST = "9.0"

# The process's one record of the extension (a shared library loads once per process):
# loaded, or the error of the one build/load attempt (not retried: a failed build is slow).
_loaded = False
_load_error: Exception | None = None
_info: dict = {}


class ExtensionBuildError(RuntimeError):
    """The extension failed to compile, link or load; the message has the compiler's output."""


def is_loaded() -> bool:
    """True once `load()` succeeded in this process (the ops' hot path asks this)."""
    return _loaded


def try_load() -> Exception | None:
    """Load once per process; None when loaded, else the remembered build/load error."""
    global _load_error
    if not _loaded and _load_error is None:
        try:
            load()
        except Exception as err:  # noqa: BLE001 - any failure means "fall back"; callers report it
            _load_error = err
    return None if _loaded else _load_error


def build_info() -> dict:
    """Where and how the loaded (or last compiled) extension was built: dir, arch list, versions,
    build seconds. Empty before the first build or load."""
    return dict(_info)


def _package_version() -> str:
    from nwor_lab import __version__

    return __version__


def arch_list() -> str:
    """CUDA architectures to compile for: the visible GPU's, else TORCH_CUDA_ARCH_LIST, else 9.0."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_CPU_ARCH_LIST


def cache_root() -> Path:
    root = os.environ.get("NWOR_LAB_CACHE_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "nwor_lab" / "ext"


def build_dir(archs: str | None = None) -> Path:
    import torch

    archs = archs or arch_list()
    tag = hashlib.sha1(archs.encode()).hexdigest()[:10]
    return cache_root() / f"{_package_version()}-torch{torch.__version__}-{tag}"


def _verbose(verbose: bool | None) -> bool:
    if verbose is not None:
        return verbose
    from nwor_lab.config import env_bool

    return env_bool("NWOR_LAB_VERBOSE_BUILD")


def _prepare_toolchain() -> None:
    """CUDA_HOME and ninja: cpp_extension guesses CUDA_HOME from `which nvcc` at import (a wrapper
    in /usr/local/bin gives /usr/local, which cannot link cudart), and needs ninja on PATH."""
    if not os.environ.get("CUDA_HOME") and not os.environ.get("CUDA_PATH") and Path("/usr/local/cuda").exists():
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    import torch.utils.cpp_extension as cpp

    if os.environ.get("CUDA_HOME"):
        cpp.CUDA_HOME = os.environ["CUDA_HOME"]
    if shutil.which("ninja") is None:
        dirs = [os.path.dirname(sys.executable)]
        try:
            import ninja

            dirs.insert(0, ninja.BIN_DIR)
        except ImportError:
            pass
        os.environ["PATH"] = os.pathsep.join(dirs + [os.environ.get("PATH", "")])


@contextmanager
def _file_lock(path: Path):
    """Exclusive advisory lock; released by the OS if the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(directory: Path, archs: str, verbose: bool) -> float:
    """Compile, link and load into this process. Returns seconds spent."""
    missing = [s for s in SOURCES if not (CSRC / s).exists()]
    if missing:
        raise ExtensionBuildError(f"CUDA sources {missing} not found in {CSRC}: the extension builds from a "
                                  f"source checkout (pip install -e .)")
    _prepare_toolchain()
    import torch.utils.cpp_extension as cpp

    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with _file_lock(directory.with_name(directory.name + ".lock")):
        (directory / "lock").unlink(missing_ok=True)  # torch's baton, left by a killed build
        with environment(TORCH_CUDA_ARCH_LIST=archs, MAX_JOBS=os.environ.get("MAX_JOBS") or str(os.cpu_count() or 2)):
            try:
                cpp.load(name=NAME, sources=[str(CSRC / s) for s in SOURCES], extra_cflags=EXTRA_CFLAGS,
                         extra_cuda_cflags=EXTRA_CUDA_CFLAGS, extra_include_paths=[str(CSRC)],
                         build_directory=str(directory), verbose=verbose, with_cuda=True,
                         is_python_module=False)
            except Exception as err:  # noqa: BLE001 - re-raised with the compiler's message
                raise ExtensionBuildError(f"building the nwor_lab CUDA extension in {directory} "
                                          f"(arch {archs}) failed:\n{err}") from err
    return time.perf_counter() - t0


def _record(directory: Path, archs: str, seconds: float) -> None:
    import torch

    _info.update(dir=str(directory), arch_list=archs, package_version=_package_version(),
                 torch_version=torch.__version__, cuda_version=torch.version.cuda,
                 cuda_home=os.environ.get("CUDA_HOME"), build_seconds=round(seconds, 2),
                 library=str(directory / f"{NAME}.so"))


def load(verbose: bool | None = None) -> None:
    """Build (first time: tens of seconds) and load the extension into this process, once.

    Afterwards `torch.ops.nwor_lab.{write_kv, log_slots, restore_slots, commit, scv_mask, noop}`
    exist with CUDA kernels, and their fake (meta) implementations are registered.
    Raises ExtensionBuildError with the compiler's output on failure.
    """
    global _loaded
    if _loaded:
        return
    archs = arch_list()
    directory = build_dir(archs)
    seconds = _build(directory, archs, _verbose(verbose))
    _loaded = True
    _record(directory, archs, seconds)
    import nwor_lab.ops.fake  # noqa: F401  (registers register_fake for every op)


def compile_only(out_dir: str | os.PathLike, verbose: bool | None = None, timeout: float = 900) -> dict:
    """Compile and link the extension into `out_dir` without touching this process (CPU machines,
    CI). Runs the build in a child process that then tries to load the library; loading a CUDA
    library without a GPU usually works, and `loaded` in the result says whether it did.

    Returns build_info-like dict plus `library` (the .so path) and `loaded`.
    Raises ExtensionBuildError (with the compiler's output) if compiling or linking fails.
    """
    out = Path(out_dir).resolve()
    archs = arch_list()
    code = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from nwor_lab.ops import _ext\n"
        f"out, archs, verbose = Path({str(out)!r}), {archs!r}, {_verbose(verbose)!r}\n"
        "import torch\n"
        "ops = []\n"
        "try:\n"
        "    s = _ext._build(out, archs, verbose)\n"
        "    loaded, err = True, ''\n"
        "    ops = sorted(n for n in _ext.OPS if hasattr(torch.ops.nwor_lab, n))\n"
        "except _ext.ExtensionBuildError as e:\n"
        "    s, loaded, err = None, False, str(e)\n"
        "print('@@RESULT@@' + json.dumps(dict(seconds=s, loaded=loaded, error=err, ops=ops)))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(CSRC.parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    seconds = time.perf_counter() - t0
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            import json

            result = json.loads(line[len("@@RESULT@@"):])
    library = out / f"{NAME}.so"
    if result is None:
        raise ExtensionBuildError(f"the build process failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    if not library.exists():
        raise ExtensionBuildError(result["error"] or f"no {library} after the build:\n{proc.stdout}\n{proc.stderr}")
    import torch

    return dict(dir=str(out), arch_list=archs, package_version=_package_version(), torch_version=torch.__version__,
                cuda_version=torch.version.cuda, build_seconds=round(seconds, 2), library=str(library),
                loaded=result["loaded"], load_error=result["error"], ops=result["ops"])
