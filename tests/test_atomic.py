"""nwor_lab.atomic: every output file is replaced whole or not at all; a full or read-only disk is one
line naming the file (on a real tmpfs where root allows mounting one; skipped with the reason
otherwise)."""
import os
import subprocess
import sys

import pytest

from nwor_lab import atomic
from fault_tools import fill, remount, temp_leftovers, tmpfs


def test_replaces_whole_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "out.json"
    atomic.write_json(target, {"a": 1})
    atomic.write_text(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["out.json"]


def test_a_failing_writer_leaves_the_previous_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(ZeroDivisionError):
        with atomic.replacing(target) as f:
            f.write("half of the new")
            1 / 0
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]
    with pytest.raises(ValueError):              # NaN is not JSON: refused before the file is touched
        atomic.write_json(target, {"x": float("nan")})
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_a_killed_writers_temporary_file_goes_with_the_next_write(tmp_path):
    target = tmp_path / "out.txt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.txt{atomic.TMP_MARK}{dead.stdout.strip()}"
    stale.write_text("half")
    atomic.write_text(target, "whole")
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]


def test_staged_path_and_move_into_place(tmp_path):
    target = tmp_path / "model.bin"
    with atomic.staged_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"weights")
        assert not target.exists()
    assert target.read_bytes() == b"weights" and os.listdir(tmp_path) == ["model.bin"]


def test_a_full_disk_is_one_line_naming_the_file():
    with tmpfs("256k") as disk:
        target = disk / "report.html"
        target.write_text("the previous report")
        fill(disk)
        with pytest.raises(atomic.OutputError) as err:
            atomic.write_text(target, "x" * 500_000)
        assert str(err.value) == (f"{target}: no space left on device (ENOSPC); nothing was written, the previous "
                                  f"file (if any) is unchanged")
        assert atomic.no_space(err.value) and "\n" not in str(err.value)
        assert target.read_text() == "the previous report" and not temp_leftovers(disk)


def test_a_read_only_disk_is_one_line_naming_the_file():
    with tmpfs("256k") as disk:
        target = disk / "sc.json"
        target.write_text("{}")
        remount(disk, readonly=True)
        with pytest.raises(atomic.OutputError, match=rf"^{target}: read-only file system \(EROFS\); nothing was "
                                                     "written"):
            atomic.write_json(target, {"ok": True})
        assert target.read_text() == "{}"
