"""Guards a sweep holds while it runs: a lock on its folder, and signals turned into a flag."""
from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from nwor_lab.sweep.grid import SweepInputError


class StopFlag:
    """SIGINT/SIGTERM -> a flag (and a count) while a sweep runs; previous handlers restored after."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.count = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        self.signum, self.count = signum, self.count + 1
        self.event.set()

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class FolderLock:
    """An exclusive `flock` on `<out>/.lock` for the sweep's lifetime (released if it dies)."""

    def __init__(self, out: Path) -> None:
        self.path, self._f = out / ".lock", None

    def __enter__(self) -> FolderLock:
        import fcntl

        self._f = open(self.path, "w")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.close()
            raise SweepInputError(f"--out {self.path.parent}: another sweep is writing there; wait for it or use another --out") from None
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()
