"""`cdcserver --version` and `--help` import nearly nothing (issue 30): none of bson,
msgspec, pymongo or the server's own modules, which `serve` and `replay` import when run."""

from __future__ import annotations

import subprocess
import sys

import pytest

_HEAVY = ("bson", "msgspec", "pymongo", "mongomock", "sqlite3", "asyncio",
          "cdcserver.config", "cdcserver.sources", "cdcserver.spark.splits", "pipeline_stages")

_PROBE = """
import sys
from cdcserver.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("MODULES", " ".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["serve", "--help"],
                                  ["config", "--defaults"]])
def test_version_and_help_import_nearly_nothing(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True,
                         text=True, check=True).stdout
    modules = set(out.rsplit("MODULES ", 1)[1].split())
    assert not sorted(m for m in modules if m.split(".")[0] in _HEAVY or m in _HEAVY)


def test_spark_default_split_size_matches_the_splits_module() -> None:
    from cdcserver.spark import cli, splits

    assert cli.DEFAULT_SPLIT_SIZE == splits.DEFAULT_SPLIT_SIZE
