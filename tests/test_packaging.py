"""The package a user installs: the wheel builds from the tree, holds what cdcserver needs at
run time (the modules, the sample oplog, py.typed, the licence in its metadata), and once
installed (not the source tree) it serves a change stream (tests/smoke_installed.py, which
`.ci/run` also runs in a fresh venv). Without uvloop (Windows has none) the server and the
test fixtures run on asyncio's own loop.
"""

from __future__ import annotations

import email.parser
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUARD_S = 300  # a hang guard for pip and the smoke run only
# What a build does not need from the working tree (and what other processes write there).
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__",
    ".pytest_cache", ".ruff_cache", ".hypothesis", "cdcserver-data",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """`pip wheel` of a copy of the tree (an in-tree build would write build/ into it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    out = tmp / "dist"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=GUARD_S,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (built,) = out.glob("cdcserver-*.whl")
    return built


def _metadata(wheel: pathlib.Path) -> tuple[list[str], email.message.Message]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        return names, email.parser.Parser().parsestr(z.read(meta).decode())


def test_wheel_holds_the_modules_data_licence_and_py_typed(wheel):
    names, meta = _metadata(wheel)
    for package in ("cdcserver", "pipeline_stages"):
        modules = {
            p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")
            if "__pycache__" not in p.parts
        }
        assert modules <= set(names), sorted(modules - set(names))
    assert "cdcserver/data/sample_oplog.jsonl" in names
    assert "cdcserver/data/config.example.toml" in names  # `cdcserver config --defaults`
    assert "cdcserver/py.typed" in names
    assert not [n for n in names if n.startswith("tests/")]
    licence = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    with zipfile.ZipFile(wheel) as z:
        assert z.read(licence) == (ROOT / "LICENSE").read_bytes()
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    # uvloop only where it has builds; the server falls back to asyncio's loop elsewhere.
    uvloop = [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("uvloop")]
    assert uvloop and all('sys_platform != "win32"' in r for r in uvloop), uvloop
    assert meta["Version"] and meta["Name"] == "cdcserver"


def test_installed_wheel_serves_a_change_stream(wheel, tmp_path):
    """The wheel unpacked by pip (`--target`: its dependencies are this interpreter's), run
    from outside the source tree: tests/smoke_installed.py, as `.ci/run` runs it."""
    target = tmp_path / "installed"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        capture_output=True, text=True, timeout=GUARD_S,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(target),  # before site-packages, where the editable install is
        "PATH": f"{target / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    smoke = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "smoke_installed.py")], cwd=work, env=env,
        capture_output=True, text=True, timeout=GUARD_S,
    )
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "FAIL" not in smoke.stdout and "smoke: all passed" in smoke.stdout, smoke.stdout


# Run in a child interpreter in which `import uvloop` fails, as on Windows.
_NO_UVLOOP = "import sys; sys.modules['uvloop'] = None\n"


def test_without_uvloop_the_fixtures_and_serve_use_asyncio(tmp_path):
    code = _NO_UVLOOP + textwrap.dedent("""
        import asyncio
        from cdcserver.testing import EmbeddedServer

        with EmbeddedServer() as server:
            assert type(server.loop).__module__.startswith("asyncio"), type(server.loop)
            with server.client() as client:
                with client.shop.orders.watch() as stream:
                    client.shop.orders.insert_one({"_id": 1})
                    assert stream.next()["documentKey"] == {"_id": 1}

        # `cdcserver serve` itself, in the same child (uvloop still absent): stopped by a
        # SIGTERM once it listens, which it answers with a graceful shutdown and status 0.
        import os, signal
        from cdcserver import server as server_module
        from cdcserver.cli import main

        loops = []
        original_start = server_module.Server.start

        async def start(self, host, port):
            bound = await original_start(self, host, port)
            loop = asyncio.get_running_loop()
            loops.append(type(loop).__module__)
            loop.call_soon(os.kill, os.getpid(), signal.SIGTERM)
            return bound

        server_module.Server.start = start
        assert main(["serve", "--in-memory", "--port", "0", "--metrics-port", "0"]) == 0
        assert loops and loops[0].startswith("asyncio"), loops
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
