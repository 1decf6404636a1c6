"""The query engine behind one adapter: `pipeline_stages/query_engine.py` is the only module of
the project that imports mongomock, and importing the project changes nothing in mongomock
(its type-order fixes are installed on the engine's first use, not at import)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "pipeline_stages/query_engine.py"


def _imports_mongomock(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "mongomock" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mongomock":
            return True
    return False


def test_only_the_adapter_imports_mongomock() -> None:
    importers = sorted(
        str(path.relative_to(ROOT))
        for package in ("cdcserver", "pipeline_stages", "tools")
        for path in (ROOT / package).rglob("*.py")
        if _imports_mongomock(path)
    )
    assert importers == [ADAPTER]


PROBE = """
import mongomock.aggregate, mongomock.filtering
before = (mongomock.filtering._get_compare_type, dict(mongomock.filtering.TYPE_MAP),
          mongomock.aggregate._Parser.parse,
          mongomock.aggregate._Parser._handle_comparison_operator)
import cdcserver.embedded.store, cdcserver.server, pipeline_stages.pipeline
after = (mongomock.filtering._get_compare_type, dict(mongomock.filtering.TYPE_MAP),
         mongomock.aggregate._Parser.parse,
         mongomock.aggregate._Parser._handle_comparison_operator)
assert before == after, "patched at import"
from pipeline_stages.user_stages import UserStages
UserStages([{"$match": {"a": 1}}])  # the engine's first use installs its fixes
assert mongomock.filtering._get_compare_type is not before[0], "not installed on first use"
print("ok")
"""


def test_importing_the_project_patches_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
