"""Guards a sweep holds while it runs: a lock on its folder, and signals turned into a flag."""
from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

from nwor_lab import lifeline
from nwor_lab.atomic import OutputError
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
    """An exclusive `flock` on `<out>/.lock` for the sweep's lifetime, and a record of who holds it.

    The kernel drops a flock when its holder dies, even by SIGKILL, while the holder's workers and
    kernels may still run (and write into the folder). So the lock file also records the holder's
    pid and `token`, the marker its children carry (`nwor_lab.lifeline`), and is emptied on a clean
    exit. A sweep that takes the lock and finds a record left there knows its predecessor died:
    it reaps every process that predecessor marked before touching the folder (`reaped`).
    """

    def __init__(self, out: Path) -> None:
        self.path, self._f = out / ".lock", None
        self.token = uuid.uuid4().hex
        self.reaped: list[int] = []
        self.previous: dict | None = None

    def __enter__(self) -> FolderLock:
        import fcntl

        self._f = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.close()
            raise SweepInputError(f"--out {self.path.parent}: another sweep is writing there; wait for it or use another --out") from None
        self._f.seek(0)
        text = self._f.read().strip()
        if text:
            try:
                self.previous = json.loads(text)
            except ValueError:
                self.previous = {}
            token = self.previous.get("token") if isinstance(self.previous, dict) else None
            if isinstance(token, str) and token:
                self.reaped = lifeline.reap(token)
        try:
            self._write(json.dumps({"pid": os.getpid(), "started": lifeline.start_time(os.getpid()),
                                    "token": self.token}))
        except OSError as err:
            self._f.close()
            raise OutputError(self.path, err) from None
        return self

    def _write(self, text: str) -> None:
        self._f.seek(0)
        self._f.truncate()
        self._f.write(text)
        self._f.flush()
        os.fsync(self._f.fileno())

    def __exit__(self, *exc) -> None:
        try:
            self._write("")      # a clean exit: nothing left to reap
        except OSError:
            pass
        self._f.close()
