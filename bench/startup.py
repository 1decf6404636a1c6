"""Start-up: how long a user waits for `cdcserver`, as a ratio to `python -c "import pymongo"`
(the floor: a driver user pays it anyway) measured in the same run.

1. `cdcserver serve --in-memory --port 0` from the process's start to its first answered
   `ping` (the port is read from the `serving` line; the ping is one OP_MSG on a raw socket,
   so no client start-up is counted).
2. `cdcserver --version` and `cdcserver --help` to their exit.

Each command runs as the console script runs it (`from cdcserver.cli import main`), the
runs interleaved so a load change hits every command alike; the median of `--runs` is
printed. Prints only; not a test. `python bench/startup.py [--runs N] [--importtime]`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time

import bson

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI = ["-c", "import sys; from cdcserver.cli import main; sys.exit(main())"]
_LISTENING = re.compile(rb"\bserving .*; on mongodb://[^\s/]+:(\d+)/[; ]")


def _env() -> dict[str, str]:
    # This checkout's cdcserver, wherever the interpreter's site-packages points.
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}
    # An installed wheel has its .pyc files: the warm-up run writes them, as pip would.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed_exit(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, env=_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _ping(port: int) -> None:
    body = bson.encode({"ping": 1, "$db": "admin"})
    msg = struct.pack("<iiiii", 16 + 4 + 1 + len(body), 1, 0, 2013, 0) + b"\x00" + body
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(msg)
        header = b""
        while len(header) < 4:
            chunk = sock.recv(4 - len(header))
            if not chunk:
                raise RuntimeError("the server closed the connection")
            header += chunk
        (length,) = struct.unpack("<i", header)
        rest = b""
        while len(rest) < length - 4:
            chunk = sock.recv(length - 4 - len(rest))
            if not chunk:
                raise RuntimeError("the server closed the connection")
            rest += chunk
    reply = bson.decode(rest[12 + 4 + 1:])
    if reply.get("ok") != 1:
        raise RuntimeError(f"ping failed: {reply}")


def timed_serve() -> float:
    """Spawn to the first answered ping of `serve --in-memory --port 0`."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *CLI, "serve", "--in-memory", "--port", "0", "--metrics-port", "0"],
        env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            match = _LISTENING.search(line)
            if match:
                _ping(int(match.group(1)))
                return time.perf_counter() - start
        raise RuntimeError("serve ended before it served:\n" + b"".join(seen).decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument(
        "--importtime", action="store_true",
        help="also print the 15 slowest imports of `serve --in-memory` (python -X importtime)",
    )
    args = parser.parse_args()
    cases = {
        "floor: python -c 'import pymongo'": lambda: timed_exit(["-c", "import pymongo"]),
        "cdcserver --version": lambda: timed_exit([*CLI, "--version"]),
        "cdcserver --help": lambda: timed_exit([*CLI, "--help"]),
        "serve --in-memory -> first ping": timed_serve,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for run in cases.values():  # one warm-up each (the page cache, .pyc files)
        run()
    for _ in range(args.runs):
        for name, run in cases.items():
            times[name].append(run())
    floor = statistics.median(next(iter(times.values())))
    print(f"start-up, median of {args.runs} runs (min..max), ratio to the floor:")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:36} {median * 1000:7.0f} ms ({min(samples) * 1000:.0f}.."
              f"{max(samples) * 1000:.0f})  {median / floor:5.2f}x")
    print("  targets (issue 30): serve -> first ping <= 1.5x, --version <= 1.2x")
    if args.importtime:
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-c",
             "import cdcserver.cli, cdcserver.server, cdcserver.deployments.embedded"],
            env=_env(), capture_output=True, text=True, check=True).stderr
        rows = [line.split("|") for line in out.splitlines() if line.startswith("import time:")
                and "cumulative" not in line]
        top = sorted(rows, key=lambda r: -int(r[1]))[:15]
        print("slowest imports (cumulative us | module):")
        for row in top:
            print(f"  {int(row[1]):8} | {row[2].rstrip()}")


if __name__ == "__main__":
    main()
