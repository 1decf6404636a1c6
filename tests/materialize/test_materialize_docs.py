"""docs/materialize.md followed word for word (as tests/test_docs.py does for docs/): its config
is valid, and its two recipes print what the page says, against `cdcserver serve --in-memory`
(the "replica set", images off) and a sidecar of it materializing `shop.*`."""

from __future__ import annotations

import re
import sys
import tomllib

from tests.test_docs import _check_config, block
from tests.test_readme import Shell, _free_port, _python, _with_port

PAGE = "materialize.md"


def printed(code: str) -> list[str]:
    """The `# ...` comment lines after the last print of each part: what the block says it
    prints (the parenthesised remark is not output)."""
    return [line[2:] for line in code.splitlines()
            if line.startswith("# ") and not line.startswith("# (")]


def test_the_config_is_valid(tmp_path):
    code = block(PAGE, "toml", "materialize =")
    assert tomllib.loads(code)["upstream"]["materialize"] == ["shop.*", "crm.accounts"]
    (tmp_path / "m.toml").write_text(code.replace("/data/retained", str(tmp_path / "r")))
    result = _check_config(tmp_path / "m.toml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_two_recipes_print_what_the_page_says(tmp_path):
    a_port, b_port = _free_port(), _free_port()
    a = Shell(f"{sys.executable} -m cdcserver.cli serve --in-memory --port {a_port} "
              "--metrics-port 0", tmp_path)
    b = None
    try:
        a.wait_for(r"INFO serving ")
        b = Shell(f"{sys.executable} -m cdcserver.cli serve --port {b_port} --metrics-port 0 "
                  f"--upstream mongodb://127.0.0.1:{a_port}/", tmp_path,
                  {"CDCSERVER_UPSTREAM_RETAIN_DIR": str(tmp_path / "retained"),
                   "CDCSERVER_UPSTREAM_MATERIALIZE": '["shop.*"]'})
        b.wait_for(r"materialize: cloned \d+ documents")
        images = block(PAGE, "python", "full_document_before_change")
        code = _with_port(_with_port(images, 27017, a_port), 27018, b_port)
        assert _python(code, tmp_path).splitlines() == printed(images)
        recipe = block(PAGE, "python", "snapshot_then_watch(orders")
        out = _python(_with_port(recipe, 27018, b_port), tmp_path)
        assert out.splitlines() == printed(recipe)
        assert re.search(r"materialize: .*synced again", b.text()) is None
    finally:
        if b is not None:
            assert b.interrupt() == 0, b.text()
        assert a.interrupt() == 0, a.text()
