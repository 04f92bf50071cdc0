"""Atomic, durable output files: a reader sees the old file or the new one, whole, never half.

    from nwor_lab import atomic
    atomic.write_text("runs/report.html", page)          # also write_bytes, write_json
    with atomic.replacing("out.json") as f: json.dump(obj, f)
    with atomic.staged_path("model.safetensors") as tmp: save_file(tensors, tmp)   # writers that want a path
    atomic.move_into_place(work / "nb.ipynb", out / "nb.ipynb")

Every write goes to a temporary file in the target's folder (a rename is atomic only within one
file system), is flushed and fsynced, renamed over the target, and the folder is fsynced so the
rename survives a power cut. The temporary file is named `.<name>.nwor-tmp-<pid>` (hidden, never
the target's name): a failed write removes it, and one that a SIGKILL cut short is removed by the
next write to the same target (its process is gone). Linux's unnamed `O_TMPFILE` would avoid even
that, but naming it afterwards (`linkat` through /proc) fails on some kernels and sandboxes.

A write that fails for the machine's reasons (full disk, read-only file system, no permission)
raises `OutputError`: an OSError whose message is one line naming the file, e.g.
`runs/x/report.html: no space left on device (ENOSPC); nothing was written, the previous file is
unchanged`. Torch-free and dependency-free: every layer may use it.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any, Iterator

TMP_MARK = ".nwor-tmp-"

_REASONS = {
    errno.ENOSPC: "no space left on device (ENOSPC)",
    errno.EDQUOT: "disk quota exceeded (EDQUOT)",
    errno.EROFS: "read-only file system (EROFS)",
    errno.EACCES: "permission denied (EACCES)",
    errno.EPERM: "operation not permitted (EPERM)",
    errno.ENOENT: "its folder does not exist (ENOENT)",
    errno.ENOTDIR: "a part of its path is not a folder (ENOTDIR)",
    errno.EISDIR: "is a folder (EISDIR)",
}


class OutputError(OSError):
    """Writing an output file failed; `str()` is one line naming the file and why."""

    def __init__(self, path, cause: OSError, left: str | None = None):
        self.path, self.cause = os.fspath(path), cause
        super().__init__(cause.errno, describe(path, cause, left))

    def __str__(self) -> str:
        return self.args[1]


def describe(path, err: OSError, left: str | None = None) -> str:
    """One line: the file, the reason in words (with the errno's name) and what was left (default:
    what an atomic write leaves)."""
    reason = _REASONS.get(err.errno) or (err.strerror or type(err).__name__).lower()
    if err.errno not in _REASONS and err.errno:
        reason += f" ({errno.errorcode.get(err.errno, err.errno)})"
    return f"{os.fspath(path)}: {reason}; {left or 'nothing was written, the previous file (if any) is unchanged'}"


def no_space(err: BaseException) -> bool:
    """True for a full disk or quota (the machine's state, not the input's)."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def fsync_dir(folder) -> None:
    """Make a rename or a new file in `folder` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(os.fspath(folder), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _named_tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def remove_stale(path) -> None:
    """Remove named temporary files of `path` left by processes that no longer run."""
    path = Path(path)
    prefix = f".{path.name}{TMP_MARK}"
    try:
        names = os.listdir(path.parent if str(path.parent) else ".")
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            pid = name[len(prefix):]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(path.with_name(name))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def replacing(path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """A file object to write `path`'s new contents into; on leaving the block without an
    exception it replaces `path` atomically and durably, otherwise `path` is left unchanged."""
    path = Path(path)
    binary = "b" in mode
    remove_stale(path)
    tmp = _named_tmp(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": encoding})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent if str(path.parent) else ".")
    except OSError as err:
        raise (err if isinstance(err, OutputError) else OutputError(path, err)) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)          # gone after the rename; left over only after a failure


@contextlib.contextmanager
def staged_path(path) -> Iterator[str]:
    """For writers that take a path (safetensors, papermill): the path of a temporary file next to
    `path`; when the block ends without an exception it is fsynced and renamed over `path`."""
    path = Path(path)
    remove_stale(path)
    tmp = _named_tmp(path)
    try:
        yield str(tmp)
        move_into_place(tmp, path)
    except OSError as err:
        raise (err if isinstance(err, OutputError) else OutputError(path, err)) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def move_into_place(src, dst) -> None:
    """fsync `src`, rename it to `dst` (same file system), fsync `dst`'s folder."""
    fd = os.open(src, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def write_bytes(path, data: bytes) -> Path:
    with replacing(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path, text: str, encoding: str = "utf-8") -> Path:
    with replacing(path, "w", encoding) as f:
        f.write(text)
    return Path(path)


def write_json(path, obj: Any, *, indent: int | None = None, newline: bool = False) -> Path:
    """`obj` as strict JSON (NaN refused) into `path`, atomically."""
    return write_text(path, json.dumps(obj, indent=indent, allow_nan=False) + ("\n" if newline else ""))
