"""Smoke test of an installed cdcserver (a wheel), not the source tree.

Run with the interpreter the wheel is installed for, from a directory outside the source tree,
with that installation's `cdcserver` first on PATH: `.ci/run` does it in a fresh venv, and
tests/test_packaging.py with the wheel unpacked by `pip install --target`. Checks that the
modules and the command come from the installation, that its metadata carries the licence and
py.typed, and that `cdcserver serve` answers a change stream to pymongo. Prints one line per
check; exits 1 when one fails.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

SOURCE_TREE = pathlib.Path(__file__).resolve().parents[1]
# Run as a script, its own folder (tests/) is sys.path[0], and there tests/pipeline_stages/
# (the tests' package) would stand in for the installed pipeline_stages: out of the path.
_HERE = pathlib.Path(__file__).resolve().parent
if sys.path and pathlib.Path(sys.path[0] or ".").resolve() == _HERE:
    del sys.path[0]
GUARD_S = 30.0  # a hang guard only


def main() -> int:
    failed = 0

    def check(name: str, ok: bool, detail: object = "") -> None:
        nonlocal failed
        failed += not ok
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)

    import cdcserver
    import pipeline_stages

    for module in (cdcserver, pipeline_stages):
        where = pathlib.Path(module.__file__ or "").resolve()
        check(f"{module.__name__} is imported from the installation", SOURCE_TREE not in
              where.parents, where)
    exe = shutil.which("cdcserver")
    check("the cdcserver command is on PATH", exe is not None, os.environ.get("PATH"))
    if exe is None:
        return 1
    check("the command is not the source tree's", SOURCE_TREE not in
          pathlib.Path(exe).resolve().parents, exe)
    dist = importlib.metadata.distribution("cdcserver")
    files = [str(f) for f in dist.files or []]
    check("LICENSE is in the metadata", any(f.endswith("licenses/LICENSE") for f in files),
          files[-8:])
    check("License-Expression is Apache-2.0",
          dist.metadata.get("License-Expression") == "Apache-2.0", dict(dist.metadata))
    package = pathlib.Path(cdcserver.__file__ or "").parent
    check("py.typed is installed", (package / "py.typed").is_file(), package)
    check("the sample oplog is installed", (package / "data" / "sample_oplog.jsonl").is_file(),
          package)
    defaults = subprocess.run([exe, "config", "--defaults"], capture_output=True, text=True)
    check("`cdcserver config --defaults` prints the commented config",
          defaults.returncode == 0 and "\n[server]\n" in defaults.stdout
          and "\nport = 27017\n" in defaults.stdout, defaults.stderr)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True)
    check("`cdcserver --version` names the version",
          version.stdout.strip() == f"cdcserver {dist.version}", version)

    with tempfile.TemporaryDirectory(prefix="cdcserver-smoke-") as tmp:
        log_path = pathlib.Path(tmp, "server.log")
        with open(log_path, "wb") as log:
            server = subprocess.Popen(
                [exe, "serve", "--in-memory", "--port", "0"], cwd=tmp,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        try:
            port = None
            deadline = time.monotonic() + GUARD_S
            while port is None and time.monotonic() < deadline and server.poll() is None:
                match = re.search(r"listening on [^:\s]+:(\d+)", log_path.read_text())
                port = int(match.group(1)) if match else None
                time.sleep(0.05)
            check("`cdcserver serve` starts", port is not None, log_path.read_text()[-500:])
            if port is None:
                return 1
            from pymongo import MongoClient

            with MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=10_000) \
                    as client:
                orders = client.shop.orders
                with orders.watch(full_document="updateLookup", max_await_time_ms=200) as stream:
                    orders.insert_one({"_id": 1, "qty": 2})
                    orders.update_one({"_id": 1}, {"$inc": {"qty": 1}})
                    events = []
                    deadline = time.monotonic() + GUARD_S
                    while len(events) < 2 and time.monotonic() < deadline:
                        event = stream.try_next()
                        if event is not None:
                            events.append(event)
            got = [(e["operationType"], e.get("fullDocument")) for e in events]
            check("a change stream sees an insert and an update (with updateLookup)",
                  got == [("insert", {"_id": 1, "qty": 2}), ("update", {"_id": 1, "qty": 3})],
                  got)
        finally:
            server.terminate()
            try:
                server.wait(GUARD_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        check("`cdcserver serve` stops on SIGTERM with status 0", server.returncode == 0,
              log_path.read_text()[-500:])
    print(f"smoke: {'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
