"""A small tmpfs for full-disk tests (skipped, saying why, where it cannot be mounted)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def small_tmpfs(where: pathlib.Path, size_bytes: int) -> Iterator[pathlib.Path]:
    """A tmpfs of `size_bytes` mounted at `where` (made), unmounted after."""
    where.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)],
            check=True, capture_output=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {exc}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def ballast(mount: pathlib.Path, free_left: int, name: str = "ballast") -> pathlib.Path:
    """A file taking all of the tmpfs but `free_left` bytes: deleting it frees the space."""
    st = os.statvfs(mount)
    size = max(0, st.f_bavail * st.f_frsize - free_left)
    path = mount / name
    with open(path, "wb") as f:
        f.write(b"\0" * size)
    return path
