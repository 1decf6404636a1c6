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

Without oplog files a server serves the embedded store: write to it with any driver and
``watch()`` the writes (``cdcserver_embedded`` / ``cdcserver_uri``: in memory;
``cdcserver_embedded_durable``: SQLite in ``tmp_path``; ``cdcserver_factory(data_dir=...,
mode="subprocess")``: a ``cdcserver serve --data-dir`` process)::

    def test_my_consumer(cdcserver_uri):
        client = pymongo.MongoClient(cdcserver_uri)
        with client.shop.orders.watch() as stream:
            client.shop.orders.insert_one({"_id": 1})
            assert stream.next()["operationType"] == "insert"

:func:`record_oplog` / :class:`OplogRecorder` write a server's oplog (read over the wire from
``local.oplog.rs``) to a BSON file that ``cdcserver serve --oplog FILE`` and ``cdcserver
replay --oplog FILE`` replay later; ``pytest --cdcserver-record-oplog DIR`` records the oplog
of every embedded server the fixtures started, one file per test.

The in-process server runs the real :class:`cdcserver.server.Server` on a uvloop loop
(asyncio's own where uvloop is not installed, as on Windows) in a daemon thread;
:meth:`ThreadServer.call` runs a function on that loop (its state belongs to it),
:attr:`ThreadServer.state` is the live :class:`~cdcserver.context.ServerState`.
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
from typing import TYPE_CHECKING, Any, TypeVar

from bson import json_util
from bson.raw_bson import RawBSONDocument

from cdcserver.sources.base import OplogLog
from pipeline_stages import bson_bytes

if TYPE_CHECKING:
    from cdcserver.deployment import Deployment

T = TypeVar("T")

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0  # a hang guard, never a performance expectation
_CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
# The line `serve` logs once everything listens (a cluster's shards log their own listeners
# before it): its wire port.
_LISTENING = re.compile(rb"\bserving .*; on mongodb://[^\s/]+:(\d+)/[; ]")

PathLike = str | os.PathLike[str]

__all__ = [
    "HOST",
    "EmbeddedServer",
    "OplogRecorder",
    "RunningServer",
    "SubprocessServer",
    "ThreadServer",
    "append_oplog",
    "cdcserver_embedded",
    "cdcserver_embedded_durable",
    "cdcserver_factory",
    "cdcserver_record_oplog",
    "cdcserver_sample",
    "cdcserver_uri",
    "die_with_parent",
    "read_oplog",
    "record_oplog",
    "rss_kib",
    "serving_port",
    "start_server",
    "write_oplog",
]


def die_with_parent() -> None:
    """A server process started by a test or a benchmark gets SIGKILL when the process that
    started it dies (Linux's PR_SET_PDEATHSIG): a run killed midway (an OOM kill, a CI
    timeout) leaves no server behind. Elsewhere a no-op. (For Popen's `preexec_fn`.)"""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def serving_port(lines: Iterable[str], seen: list[str] | None = None) -> int:
    """The wire port of a ``cdcserver serve --port 0`` from its output lines (read until the
    line it logs once everything listens); each line read is appended to ``seen``. A process
    that ends before that line raises, its output in the message."""
    read = seen if seen is not None else []
    for line in lines:
        read.append(line)
        match = _LISTENING.search(line.encode())
        if match:
            return int(match.group(1))
    raise RuntimeError("cdcserver ended before it served:\n" + "".join(read))


# -- oplog files ----------------------------------------------------------------------------------


def _is_json(path: PathLike) -> bool:
    return pathlib.Path(path).suffix.lower() in (".json", ".jsonl", ".ejson")


def _encode(entries: Iterable[Mapping[str, Any]], as_json: bool) -> bytes:
    out: list[bytes | memoryview] = []
    for entry in entries:
        raw = entry.raw if isinstance(entry, RawBSONDocument) else bson_bytes.encode(entry)
        if as_json:
            text = json_util.dumps(bson_bytes.decode(raw), json_options=_CANONICAL)
            out.append(text.encode() + b"\n")
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
    """The server in this process, on its own event loop (uvloop where installed) in a
    daemon thread.

    Pass the oplog as file paths, or as an :class:`OplogLog` made by ``make_log`` (called on
    the server's loop thread, e.g. an embedded store's log), or a whole serving mode as a
    :class:`~cdcserver.deployment.Deployment` made by ``make_deployment`` (started before the
    listener, stopped after it).
    """

    def __init__(
        self,
        oplog_paths: Iterable[PathLike] = (),
        *,
        follow: bool = True,
        make_log: Callable[[], OplogLog] | None = None,
        make_deployment: Callable[[], Deployment] | None = None,
        max_connections: int = 10_000,
        config: Any = None,
        **state_options: Any,
    ) -> None:
        self.config = config  # a cdcserver.config.Config: its [auth], [tls] and limits apply
        self.oplog_paths = [pathlib.Path(p) for p in oplog_paths]
        if not self.oplog_paths and make_log is None and make_deployment is None:
            raise ValueError("give oplog paths, make_log or make_deployment")
        self._follow = follow
        self._make_log = make_log
        self._make_deployment = make_deployment
        self._deployment: Deployment | None = None  # once started
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

    def deployment(self) -> Deployment:
        """What this server serves (called on the server's loop thread)."""
        from cdcserver.deployments import for_oplog
        from cdcserver.sources.file import FileOplog

        if self._make_deployment is not None:
            return self._make_deployment()
        log = self._make_log() if self._make_log else FileOplog([str(p) for p in self.oplog_paths])
        return for_oplog(log, follow=self._follow)

    async def _start(self) -> Any:
        from cdcserver.deployment import server_state
        from cdcserver.server import Server

        deployment = self.deployment()
        await deployment.start(HOST)
        self._deployment = deployment
        state = server_state(deployment, **self._state_options)
        if self.config is not None:
            from cdcserver.server import server_for_config

            server = server_for_config(state, self.config)
        else:
            server = Server(state, self._max_connections)
        await server.start(HOST, 0)
        return server

    @property
    def log(self) -> OplogLog:
        log: OplogLog = self.state.oplog
        return log

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
        count: int = self.call(lambda: self.state.connections)
        return count

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self.run(self.server.close())
            if self._deployment is not None:
                self.run(self._deployment.stop())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(START_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


class EmbeddedServer(ThreadServer):
    """The embedded store served in this process: in memory, or durable in ``data_dir``.

    :attr:`store` is the live :class:`~cdcserver.embedded.store.Store` (it belongs to the
    server's loop thread: read it between requests, or through :meth:`call`). ``store_options``
    go to the store (``oplog_size_bytes``, ``synchronous``, ...). The periodic no-op writer is
    off unless ``noop_interval_s`` is given, so a test's oplog holds only its own writes.
    """

    def __init__(
        self,
        data_dir: PathLike | None = None,
        *,
        noop_interval_s: float = 0.0,
        max_connections: int = 10_000,
        config: Any = None,
        **store_options: Any,
    ) -> None:
        from cdcserver.deployments.embedded import EmbeddedDeployment
        from cdcserver.embedded.store import Store
        from cdcserver.sources.embedded import EmbeddedOplog

        self.data_dir = pathlib.Path(data_dir) if data_dir is not None else None
        self.store = Store(str(data_dir) if data_dir is not None else None, **store_options)
        try:
            self.oplog = EmbeddedOplog(self.store, noop_interval_s=noop_interval_s)
            super().__init__(
                make_deployment=lambda: EmbeddedDeployment(
                    self.store, self.oplog, follow=noop_interval_s > 0),
                max_connections=max_connections,
                config=config,
            )
        except BaseException:
            self.store.close()
            raise

    def client(self, **kwargs: Any) -> Any:
        """A pymongo client connected directly to this server."""
        from pymongo import MongoClient

        kwargs.setdefault("serverSelectionTimeoutMS", 5000)
        return MongoClient(self.direct_uri, **kwargs)

    def entries(self) -> list[dict[str, Any]]:
        """Every oplog entry, decoded (UUIDs as Binary, datetimes naive)."""
        raw = self.store.oplog_entries() if self._stopped else self.call(self.store.oplog_entries)
        return [bson_bytes.decode(r) for r in raw]

    def stop(self) -> None:
        if self._stopped:
            return
        try:
            super().stop()
        finally:
            self.store.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # no uvloop (it has no Windows build): asyncio's own loop
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
        oplog_paths: Iterable[PathLike] = (),
        *,
        follow: bool = True,
        data_dir: PathLike | None = None,
        upstream: str | None = None,
        log_path: PathLike | None = None,
        extra_args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.oplog_paths = [pathlib.Path(p) for p in oplog_paths]
        self.data_dir = pathlib.Path(data_dir) if data_dir is not None else None
        if sum((bool(self.oplog_paths), self.data_dir is not None, upstream is not None)) > 1:
            raise ValueError("give oplog files, a data directory or an upstream, only one")
        self._own_log = log_path is None
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="cdcserver-", suffix=".log")
            os.close(fd)
        self.log_path = pathlib.Path(log_path)
        args = [
            sys.executable, "-m", "cdcserver.cli", "serve", "--host", HOST, "--port", "0",
            "--metrics-port", "0",  # any free port: servers side by side never collide
        ]
        if self.oplog_paths:
            args += ["--oplog", *map(str, self.oplog_paths)]
            if follow:
                args.append("--follow")
        elif self.data_dir is not None:  # the embedded store, durable
            args += ["--data-dir", str(self.data_dir)]
        elif upstream is not None:  # a sidecar of a live replica set or cluster
            args += ["--upstream", upstream]
        else:  # the embedded store, in memory
            args.append("--in-memory")
        args += list(extra_args)
        self.args = args
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            # (PR_SET_PDEATHSIG follows the thread that forks: only the main thread's)
            preexec_fn=die_with_parent
            if threading.current_thread() is threading.main_thread() else None,
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

    def kill(self) -> int:
        """SIGKILL: no shutdown of any kind (a crash). Returns the exit status."""
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()

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
    """Start a server (``mode`` ``"thread"`` or ``"subprocess"``); the caller stops it.

    With oplog files it serves them; without, it serves the embedded store: in memory, or
    durable in ``data_dir=...``.
    """
    if isinstance(oplog_paths, (str, os.PathLike)):
        oplog_paths = [oplog_paths]
    oplog_paths = list(oplog_paths)
    if mode == "thread":
        if not oplog_paths and "make_log" not in options:
            options.pop("follow", None)
            return EmbeddedServer(options.pop("data_dir", None), **options)
        return ThreadServer(oplog_paths, **options)
    if mode == "subprocess":
        return SubprocessServer(oplog_paths, **options)
    raise ValueError(f"mode must be 'thread' or 'subprocess', not {mode!r}")


# -- recording an oplog ---------------------------------------------------------------------------


def _client_for(source: Any) -> tuple[Any, bool]:
    """(a pymongo client, whether it is ours to close) for a server, a URI or a client."""
    from pymongo import MongoClient

    if isinstance(source, RunningServer):
        return MongoClient(source.direct_uri, serverSelectionTimeoutMS=5000), True
    if isinstance(source, str):
        return MongoClient(source, serverSelectionTimeoutMS=5000), True
    return source, False


def read_oplog(source: Any, *, since: Any = None) -> list[RawBSONDocument]:
    """The entries of a server's ``local.oplog.rs`` (those after the Timestamp ``since``, or
    all), read over the wire in natural order: works with any cdcserver (embedded or not)
    and with a real replica-set member."""

    client, own = _client_for(source)
    try:
        oplog = client.get_database(
            "local", codec_options=bson_bytes.codec_options(document_class=RawBSONDocument)
        )["oplog.rs"]
        query = {} if since is None else {"ts": {"$gt": since}}
        return list(oplog.find(query).sort("$natural", 1))
    finally:
        if own:
            client.close()


def record_oplog(source: Any, path: PathLike, *, since: Any = None) -> pathlib.Path:
    """Write a server's oplog (after ``since``, or all of it) to ``path``: concatenated BSON
    (mongodump's ``oplog.bson``), or Extended JSON lines for a ``.json``/``.jsonl`` path.
    ``cdcserver serve --oplog PATH`` and ``cdcserver replay --oplog PATH`` replay it."""
    return write_oplog(path, read_oplog(source, since=since))


class OplogRecorder:
    """Records what a server's oplog gains while the block runs (or, with
    ``from_start=True``, all of it) to a file when the block ends::

        with OplogRecorder(server, tmp_path / "run.bson") as rec:
            ...                                   # the test's writes
        events = replay_events([str(rec.path)], cmd, "db")
    """

    def __init__(self, source: Any, path: PathLike, *, from_start: bool = False) -> None:
        self.source = source
        self.path = pathlib.Path(path)
        self.from_start = from_start
        self.since: Any = None
        self.count = 0

    def __enter__(self) -> OplogRecorder:
        if not self.from_start:
            last = read_oplog_last(self.source)
            self.since = last["ts"] if last is not None else None
        return self

    def save(self) -> pathlib.Path:
        entries = read_oplog(self.source, since=self.since)
        self.count = len(entries)
        return write_oplog(self.path, entries)

    def __exit__(self, *exc: object) -> None:
        self.save()


def read_oplog_last(source: Any) -> Mapping[str, Any] | None:
    """The newest entry of a server's oplog (``find().sort({$natural: -1}).limit(1)``)."""
    client, own = _client_for(source)
    try:
        last: Mapping[str, Any] | None = client.local["oplog.rs"].find_one(
            {}, sort=[("$natural", -1)]
        )
        return last
    finally:
        if own:
            client.close()


# -- fixtures -------------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - the plugin is only loaded by pytest
    pytest = None  # type: ignore[assignment]

RECORD_OPTION = "--cdcserver-record-oplog"


def _record_path(directory: str, nodeid: str, n: int) -> pathlib.Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_") or "test"
    return pathlib.Path(directory) / (f"{name}.bson" if n == 0 else f"{name}.{n}.bson")


if pytest is not None:

    def pytest_addoption(parser: Any) -> None:
        parser.addoption(
            RECORD_OPTION,
            metavar="DIR",
            default=os.environ.get("CDCSERVER_RECORD_OPLOG") or None,
            help="write the oplog of every embedded cdcserver a test started (cdcserver.testing "
            "fixtures) to DIR/<test id>.bson when the test ends, for `cdcserver serve --oplog` "
            "or `cdcserver replay` (default: $CDCSERVER_RECORD_OPLOG)",
        )

    def _record_dir(request: Any) -> str | None:
        try:
            option: str | None = request.config.getoption(RECORD_OPTION)
            return option
        except ValueError:  # the option was not registered (plugin loaded late)
            return os.environ.get("CDCSERVER_RECORD_OPLOG") or None

    def _stop_all(request: Any, started: list[RunningServer]) -> None:
        directory = _record_dir(request)
        n = 0
        for server in reversed(started):
            if directory and not server.oplog_paths:  # an embedded store: record it
                with contextlib.suppress(Exception):
                    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
                    record_oplog(server, _record_path(directory, request.node.nodeid, n))
                    n += 1
            with contextlib.suppress(Exception):
                server.stop()

    @pytest.fixture
    def cdcserver_factory(request: Any) -> Iterator[Callable[..., RunningServer]]:
        """``start(oplog_paths, mode="thread"|"subprocess", follow=True, ...)`` -> a running
        server; every server started is stopped when the test ends. Without oplog files it
        starts the embedded store (in memory, or durable with ``data_dir=...``)."""
        started: list[RunningServer] = []

        def start(oplog_paths: Any = (), **options: Any) -> RunningServer:
            server = start_server(oplog_paths, **options)
            started.append(server)
            return server

        yield start
        _stop_all(request, started)

    @pytest.fixture
    def cdcserver_embedded(request: Any) -> Iterator[EmbeddedServer]:
        """An embedded-store server in memory (in this process) on a free port; write to it
        with any driver through ``.uri`` and ``watch()`` the writes."""
        server = EmbeddedServer()
        yield server
        _stop_all(request, [server])

    @pytest.fixture
    def cdcserver_embedded_durable(
        request: Any, tmp_path: pathlib.Path
    ) -> Iterator[EmbeddedServer]:
        """An embedded-store server persisting to SQLite in ``tmp_path / "cdcserver-data"``
        (``.data_dir``): start another ``EmbeddedServer(server.data_dir)`` after stopping it
        to test what survives a restart."""
        server = EmbeddedServer(tmp_path / "cdcserver-data")
        yield server
        _stop_all(request, [server])

    @pytest.fixture
    def cdcserver_uri(cdcserver_embedded: EmbeddedServer) -> str:
        """The URI of an in-memory embedded-store server (``cdcserver_embedded``)."""
        return cdcserver_embedded.uri

    @pytest.fixture
    def cdcserver_record_oplog(tmp_path: pathlib.Path) -> Callable[..., pathlib.Path]:
        """``record(server_or_uri, path=None, since=None)`` writes the server's oplog to a
        BSON file (default ``tmp_path / "oplog.bson"``) and returns its path."""

        def record(source: Any, path: PathLike | None = None, since: Any = None) -> pathlib.Path:
            return record_oplog(source, path or tmp_path / "oplog.bson", since=since)

        return record

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
