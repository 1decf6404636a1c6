"""A pytest plugin: real cdcserver instances on free 127.0.0.1 ports, for real drivers.

Enable it with ``pytest_plugins = ["cdcserver.testing"]`` in a conftest (or ``-p
cdcserver.testing``), then::

    def test_watch(cdcserver_factory, tmp_path):
        path = write_oplog(tmp_path / "oplog.bson", entries)    # or .jsonl: Extended JSON
        server = cdcserver_factory(path)                        # in-process, own loop thread
        with pymongo.MongoClient(server.uri) as client:
            ...
            server.append(more_entries)                         # the followed file grows

``mode="subprocess"`` runs ``python -m cdcserver.cli serve`` instead (its own process: its
RSS is measurable with :meth:`SubprocessServer.rss_kib`, its log is a file). Either way the
port is chosen by the OS (``--port 0``), so there is no race for a free port, and the
server is stopped (its connections and cursors closed) when the test ends.

The in-process server runs the real :class:`cdcserver.server.Server` on a uvloop loop in a
daemon thread; :meth:`ThreadServer.call` runs a function on that loop (its state belongs to
it), :attr:`ThreadServer.state` is the live :class:`~cdcserver.context.ServerState`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import bson
from bson import json_util
from bson.raw_bson import RawBSONDocument

from cdcserver.sources.base import OplogLog

T = TypeVar("T")

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0  # a hang guard, never a performance expectation
_CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
_LISTENING = re.compile(rb"listening on [^:\s]+:(\d+)")

PathLike = str | os.PathLike[str]

__all__ = [
    "HOST",
    "RunningServer",
    "SubprocessServer",
    "ThreadServer",
    "append_oplog",
    "cdcserver_factory",
    "cdcserver_sample",
    "rss_kib",
    "start_server",
    "write_oplog",
]


# -- oplog files ----------------------------------------------------------------------------------


def _is_json(path: PathLike) -> bool:
    return pathlib.Path(path).suffix.lower() in (".json", ".jsonl", ".ejson")


def _encode(entries: Iterable[Mapping[str, Any]], as_json: bool) -> bytes:
    out = []
    for entry in entries:
        raw = entry.raw if isinstance(entry, RawBSONDocument) else bson.encode(entry)
        if as_json:
            out.append(json_util.dumps(bson.decode(raw), json_options=_CANONICAL).encode() + b"\n")
        else:
            out.append(raw)
    return b"".join(out)


def write_oplog(path: PathLike, entries: Iterable[Mapping[str, Any]]) -> pathlib.Path:
    """Write oplog entries as a recorded oplog: ``.json``/``.jsonl``/``.ejson`` as canonical
    Extended JSON lines, anything else as concatenated BSON (mongodump's ``oplog.bson``)."""
    path = pathlib.Path(path)
    path.write_bytes(_encode(entries, _is_json(path)))
    return path


def append_oplog(path: PathLike, entries: Iterable[Mapping[str, Any]]) -> None:
    """Append entries to a recorded oplog in its format, in one write (whole entries only)."""
    data = _encode(entries, _is_json(path))
    with open(path, "ab") as f:
        f.write(data)
        f.flush()


def rss_kib(pid: int | None = None) -> int:
    """Resident set size of a process (default: this one) in KiB, from /proc."""
    where = "self" if pid is None else str(pid)
    with open(f"/proc/{where}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{where}/status")


# -- servers ---------------------------------------------------------------------------------


class RunningServer:
    """What every way of running a server offers a test."""

    host = HOST
    port: int = 0
    oplog_paths: list[pathlib.Path]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def uri(self) -> str:
        """A plain seed list: drivers discover the replica set from hello."""
        return f"mongodb://{self.address}/"

    @property
    def direct_uri(self) -> str:
        return f"mongodb://{self.address}/?directConnection=true"

    def append(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Append entries to the (last) oplog file; the server tails it."""
        if not self.oplog_paths:
            raise RuntimeError("this server does not serve an oplog file")
        append_oplog(self.oplog_paths[-1], entries)

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ThreadServer(RunningServer):
    """The server in this process, on its own event loop (uvloop) in a daemon thread.

    Pass the oplog as file paths, or as an :class:`OplogLog` made by ``make_log`` (called on
    the server's loop thread, e.g. an embedded store's log).
    """

    def __init__(
        self,
        oplog_paths: Iterable[PathLike] = (),
        *,
        follow: bool = True,
        make_log: Callable[[], OplogLog] | None = None,
        max_connections: int = 10_000,
        **state_options: Any,
    ) -> None:
        self.oplog_paths = [pathlib.Path(p) for p in oplog_paths]
        if not self.oplog_paths and make_log is None:
            raise ValueError("give oplog paths or make_log")
        self._follow = follow
        self._make_log = make_log
        self._max_connections = max_connections
        self._state_options = state_options
        self._stopped = False
        self.loop = _new_loop()
        self._thread = threading.Thread(
            target=self._run_loop, name="cdcserver-test-loop", daemon=True
        )
        self._thread.start()
        try:
            self.server = self.run(self._start())
        except BaseException:
            self._stop_loop()
            raise
        self.state = self.server.state
        self.port = self.state.port

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _start(self) -> Any:
        from cdcserver.context import ServerState
        from cdcserver.server import Server
        from cdcserver.sources.file import FileOplog

        log = self._make_log() if self._make_log else FileOplog([str(p) for p in self.oplog_paths])
        state = ServerState(log=log, **self._state_options)
        state.follow = self._follow
        server = Server(state, self._max_connections)
        await server.start(HOST, 0)
        return server

    @property
    def log(self) -> OplogLog:
        return self.state.log

    def run(self, coro: Any, timeout: float | None = START_TIMEOUT_S) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function on the server's loop thread (the state belongs to it)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def invoke() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(invoke)
        return future.result(START_TIMEOUT_S)

    def append(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Append to the oplog file and have the server read it now (no tailing delay)."""
        super().append(entries)
        refresh = getattr(self.log, "refresh", None)
        if refresh is not None:
            self.call(refresh)

    def cursor_ids(self) -> set[int]:
        return self.call(lambda: set(self.state.cursors.cursors))

    def connection_count(self) -> int:
        return self.call(lambda: self.state.connections)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self.run(self.server.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(START_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class SubprocessServer(RunningServer):
    """``python -m cdcserver.cli serve --port 0 --oplog ... [--follow]`` in its own process.

    The bound port is read from the server's log (written to ``log_path``, so the pipe never
    fills; a temporary file, removed by :meth:`stop`, unless given); :meth:`stop` sends
    SIGTERM (graceful shutdown) and kills only if that hangs.
    """

    def __init__(
        self,
        oplog_paths: Iterable[PathLike],
        *,
        follow: bool = True,
        log_path: PathLike | None = None,
        extra_args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.oplog_paths = [pathlib.Path(p) for p in oplog_paths]
        if not self.oplog_paths:
            raise ValueError("give at least one oplog file")
        self._own_log = log_path is None
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="cdcserver-", suffix=".log")
            os.close(fd)
        self.log_path = pathlib.Path(log_path)
        args = [
            sys.executable, "-m", "cdcserver.cli", "serve", "--host", HOST, "--port", "0",
            "--oplog", *map(str, self.oplog_paths), *extra_args,
        ]
        if follow:
            args.append("--follow")
        self.args = args
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            self.port = self._wait_listening()
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_bytes().decode(errors="replace")

    def _wait_listening(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log_path.read_bytes())
            if match:
                return int(match.group(1))
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"cdcserver exited with {self.process.returncode}:\n{self.log_text()}"
                )
            time.sleep(0.02)
        raise RuntimeError(f"cdcserver did not start listening:\n{self.log_text()}")

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()
        if self._own_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


def start_server(
    oplog_paths: PathLike | Iterable[PathLike] = (), *, mode: str = "thread", **options: Any
) -> RunningServer:
    """Start a server (``mode`` ``"thread"`` or ``"subprocess"``); the caller stops it."""
    if isinstance(oplog_paths, (str, os.PathLike)):
        oplog_paths = [oplog_paths]
    if mode == "thread":
        return ThreadServer(oplog_paths, **options)
    if mode == "subprocess":
        return SubprocessServer(oplog_paths, **options)
    raise ValueError(f"mode must be 'thread' or 'subprocess', not {mode!r}")


# -- fixtures -------------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - the plugin is only loaded by pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def cdcserver_factory() -> Iterator[Callable[..., RunningServer]]:
        """``start(oplog_paths, mode="thread"|"subprocess", follow=True, ...)`` -> a running
        server; every server started is stopped when the test ends."""
        started: list[RunningServer] = []

        def start(oplog_paths: Any = (), **options: Any) -> RunningServer:
            server = start_server(oplog_paths, **options)
            started.append(server)
            return server

        yield start
        for server in reversed(started):
            with contextlib.suppress(Exception):
                server.stop()

    @pytest.fixture
    def cdcserver_sample(
        cdcserver_factory: Callable[..., RunningServer], tmp_path: pathlib.Path
    ) -> RunningServer:
        """An in-process server replaying (a copy of) the sample oplog shipped with the
        package; ``append`` adds to the copy."""
        from cdcserver.cli import sample_oplog_path

        copy = tmp_path / "sample_oplog.jsonl"
        copy.write_bytes(pathlib.Path(sample_oplog_path()).read_bytes())
        return cdcserver_factory(copy)
