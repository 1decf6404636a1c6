"""The listener: one asyncio task per connection, on uvloop.

Each connection reads frames (`cdcserver.wire`), runs one command at a time (like mongod, a
connection's requests are answered in order), and writes the reply. A malformed frame closes
that connection only; every other connection goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import itertools
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from bson.codec_options import CodecOptions, DatetimeConversion

from cdcserver import wire
from cdcserver.auth import ServerAuth
from cdcserver.commands import failpoints
from cdcserver.commands.registry import error_reply, run_command
from cdcserver.config import Config, port_in_use, unix_socket_mode
from cdcserver.context import ConnectionState, ServerState
from cdcserver.deployment import Deployment, server_state
from cdcserver.logs import log_slow_command, serving_summary, slow_log
from cdcserver.tls import (
    PLAINTEXT_ERROR,
    PLAINTEXT_ERROR_CODE,
    RECEIVE_ERROR,
    TlsListener,
    tcp_sockets,
    unix_socket,
)
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.release import RELEASES

log = logging.getLogger(__name__)

T = TypeVar("T")

# Commands arrive as plain dicts (tz-aware dates keep their instant exactly).
REQUEST_CODEC: CodecOptions[dict[str, Any]] = bson_bytes.codec_options(
    tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
_request_ids = itertools.count(1)
_HELLO = frozenset({"hello", "isMaster", "ismaster"})
# How long close() waits for the connections and background tasks it cancelled: a task that
# does not end by then is logged with its stack and left behind (a shutdown never hangs).
CLOSE_TASKS_S = 10.0
DECODE_OFF_LOOP_BYTES = 1 << 20  # messages this large are decoded in a worker thread


class StartupError(Exception):
    """The server could not start (a port in use...): the message names the config key."""


class Server:
    def __init__(
        self,
        state: ServerState,
        max_connections: int = 10_000,
        *,
        ssl_context: ssl.SSLContext | None = None,
        idle_timeout_s: float = 0.0,
        unix_socket_prefix: str | None = None,
        unix_socket_permissions: int = 0o700,
    ) -> None:
        self.state = state
        self.max_connections = max_connections
        self.ssl_context = ssl_context  # TLS on the listener ([tls])
        self.idle_timeout_s = idle_timeout_s  # close a connection silent this long (0: never)
        self._server: asyncio.Server | TlsListener | None = None
        # mongod's net.unixDomainSocket: <prefix>/mongodb-<port>.sock beside the TCP listener
        # (None: none, as --nounixsocket).
        self.unix_socket_prefix = unix_socket_prefix
        self.unix_socket_permissions = unix_socket_permissions
        self.unix_socket_path: str | None = None
        self._unix_server: asyncio.Server | TlsListener | None = None
        self._unix_inode: tuple[int, int] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._background: list[asyncio.Task[Any]] = []
        self._connections: dict[int, ConnectionState] = {}

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        if self.ssl_context is None:
            self._server = await asyncio.start_server(self._on_connection, host, port)
        else:  # a plaintext client is logged, as mongod logs it (tls.py)
            self._server = TlsListener(tcp_sockets(host, port), self.ssl_context,
                                       self._on_connection, self._plaintext_refused)
        sock = self._server.sockets[0]
        bound: int = sock.getsockname()[1]  # (host, port) for IPv4, 4 fields for IPv6
        self.state.host, self.state.port = host, bound
        if self.unix_socket_prefix is not None:
            try:
                await self._listen_unix(unix_socket_path(self.unix_socket_prefix, bound))
            except BaseException:
                self._server.close()
                raise
        self._background.append(asyncio.create_task(self.state.cursors.reap_forever()))
        tailer = self.state.tailer
        if self.state.follow and tailer is not None:
            # ensure_future: the state types its tailer as any awaitable (a coroutine here).
            self._background.append(asyncio.ensure_future(tailer()))
        if self.state.store is not None:
            self._background.append(asyncio.create_task(self.state.store.ttl_monitor()))
            self._background.append(asyncio.create_task(self.state.store.pre_image_remover()))
        log.info("listening on %s:%d", host, bound)
        return bound

    async def _listen_unix(self, path: str) -> None:
        """Listen on the Unix domain socket `path` as mongod does (transport layer setup): a
        file left there (a stale socket of a server that did not stop cleanly) is removed
        first, and the socket gets the configured permissions. Any failure fails startup
        (StartupError), as mongod's does."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StartupError(
                f"server.unix_socket: cannot remove the old socket file {path}: "
                f"{exc.strerror or exc}"
            ) from None
        try:
            if self.ssl_context is None:
                self._unix_server = await asyncio.start_unix_server(self._on_connection, path)
            else:
                self._unix_server = TlsListener([unix_socket(path)], self.ssl_context,
                                                self._on_connection, self._plaintext_refused)
            os.chmod(path, self.unix_socket_permissions)
            st = os.stat(path)
        except OSError as exc:
            await self._close_unix()
            raise StartupError(
                f"server.unix_socket: cannot listen on {path}: {exc.strerror or exc} "
                "(server.unix_socket = false, or --nounixsocket, runs without it)"
            ) from None
        self.unix_socket_path = path
        self._unix_inode = (st.st_dev, st.st_ino)
        log.info("unix domain socket %s", path, extra={"path": path})

    async def _close_unix(self) -> None:
        """Stop accepting on the Unix domain socket and remove its file (mongod removes it at
        shutdown) unless another server has since put its own socket at that path."""
        server, self._unix_server = self._unix_server, None
        if server is not None:
            server.close()
        path, inode = self.unix_socket_path, self._unix_inode
        self._unix_inode = None
        if path is not None and inode is not None:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if (st.st_dev, st.st_ino) == inode:
                    os.unlink(path)
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def shutdown(self, grace_s: float) -> None:
        """Graceful: stop accepting connections, have awaitData getMores answer with what they
        have now, let requests in flight finish (up to `grace_s`), then close every connection.
        Commands that arrive meanwhile get 91 ShutdownInProgress (commands/registry.py)."""
        state = self.state
        state.shutting_down = True
        state.quiescing.set()
        if self._server is not None:
            self._server.close()  # the listening socket only; connections stay open
        if self._unix_server is not None:
            self._unix_server.close()  # likewise (its file goes in close())
        for cursor in state.cursors.cursors.values():
            cursor.draining = True
        state.oplog.notify()  # wakes every getMore waiting for events
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while loop.time() < deadline and self.in_flight():
            await asyncio.sleep(0.005)
        left = self.in_flight()
        if left:
            log.warning(
                "shutdown: %d request(s) still running after %.1fs: closing their connections",
                len(left), grace_s, extra={"commands": left},
            )
        await self.close()

    def in_flight(self) -> list[str]:
        """The commands being run, one per busy connection."""
        return [c.command for c in self._connections.values() if c.command is not None]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=CLOSE_TASKS_S)
            for task in stuck:
                frames = "".join(
                    f"\n  {f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}"
                    for f in task.get_stack()
                )
                log.error("shutdown: task %s did not end in %.0f s; left behind at:%s",
                          task.get_name(), CLOSE_TASKS_S, frames)
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: its failure was logged where it happened
        await self._close_unix()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TASKS_S):
                    await self._server.wait_closed()

    def _peer_string(self, peer: Any) -> str:
        if isinstance(peer, tuple):
            return f"{peer[0]}:{peer[1]}"
        # The Unix domain socket: mongod's remote is "anonymous unix socket:<port>".
        return f"{peer or 'anonymous unix socket'}:{self.state.port}"

    def _plaintext_refused(self, peer: Any) -> None:
        """A client that did not start TLS on the TLS port: one line, as mongod's (id 22988),
        with the connection id it would have had."""
        conn_id = self.state.next_connection_id()
        peer_str = self._peer_string(peer)
        log.info(
            "connection %d from %s: %s: SSLHandshakeFailed: %s", conn_id, peer_str,
            RECEIVE_ERROR, PLAINTEXT_ERROR,
            extra={"conn": conn_id, "peer": peer_str, "errCode": PLAINTEXT_ERROR_CODE,
                   "errName": "SSLHandshakeFailed"},
        )

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        state = self.state
        peer_str = self._peer_string(writer.get_extra_info("peername"))
        if state.connections >= self.max_connections:
            log.warning("connection from %s refused: %d open", peer_str, state.connections)
            writer.close()
            self._tasks.discard(task)
            return
        conn = ConnectionState(state.next_connection_id(), peer_str)
        state.connections += 1
        self._connections[conn.id] = conn
        log.info(
            "connection %d accepted from %s", conn.id, peer_str,
            extra={"conn": conn.id, "peer": peer_str},
        )
        try:
            await self._serve(conn, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except wire.ProtocolError as exc:
            log.info("connection %d closed: %s", conn.id, exc.errmsg)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection %d failed", conn.id, extra={"conn": conn.id})
        finally:
            state.connections -= 1
            self._connections.pop(conn.id, None)
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            log.info("connection %d ended", conn.id, extra={"conn": conn.id, "peer": peer_str})

    async def _serve(
        self, conn: ConnectionState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        frames = wire.FrameReader(max_message_size=self.state.max_message_bytes)
        state = self.state
        idle = self.idle_timeout_s
        watch = _IdleWatch(idle) if idle > 0 else None
        read = reader.read
        write = writer.write
        transport = writer.transport
        pending = b""  # what the client sent while an awaitable hello watched its socket
        while True:
            if pending:
                data, pending = pending, b""
            elif watch is not None:
                try:
                    data = await watch.read(read)
                except asyncio.CancelledError:
                    if not watch.expired:
                        raise
                    log.info("connection %d closed: idle for %ss", conn.id, idle)
                    return
            else:
                data = await read(256 * 1024)
            if not data:
                return
            for frame in frames.feed(data):
                try:
                    if len(frame.data) >= DECODE_OFF_LOOP_BYTES:
                        # Its checksum and BSON cost milliseconds (seconds with the pure-Python
                        # CRC-32C): a worker thread, so the loop serves the others meanwhile.
                        request = await asyncio.to_thread(
                            wire.decode_request, frame, codec_options=REQUEST_CODEC
                        )
                    else:
                        request = wire.decode_request(frame, codec_options=REQUEST_CODEC)
                except wire.ProtocolError as exc:
                    if exc.fatal or exc.request_id is None:
                        raise
                    if exc.more_to_come:
                        # mongod builds the error reply and then drops it (makeCommandResponse:
                        # moreToCome means no reply); the connection goes on.
                        continue
                    # mongod answers this request with the error and keeps the connection.
                    write(_parse_error_reply(frame, exc))
                    await writer.drain()
                    continue
                cmd = _command_of(request)
                name = next(iter(cmd), "")
                # An awaitable hello (a driver's monitor) has nothing to finish at shutdown,
                # and its wait is not work: neither in flight nor slow.
                awaitable = name in _HELLO and "maxAwaitTimeMS" in cmd
                conn.command = None if awaitable else name
                conn.awaited_s = 0.0
                started = time.perf_counter()
                try:
                    if awaitable:
                        reply, sent = await _run_watching(state, conn, cmd, read)
                        pending += sent
                        if reply is None:
                            return  # the client closed the connection: nobody to answer
                    else:
                        reply = await run_command(state, conn, cmd)
                    if name in _HELLO:
                        reply = _check_exhaust_hello(state, name, cmd, request, reply)
                    # Like mongod's durationMillis: the awaitData wait for events is left out.
                    took = time.perf_counter() - started - conn.awaited_s
                    if name == "getMore" and state.metrics is not None:
                        state.metrics.get_more_seconds.observe(took)
                    slow = took >= state.slow_s and not awaitable
                    if slow and slow_log.isEnabledFor(logging.INFO):
                        ns = failpoints.command_namespace(name, cmd, cmd.get("$db", "admin"))
                        log_slow_command(took, conn.id, name, ns, reply)
                    if getattr(request, "more_to_come", False):
                        continue  # the client asked for no reply
                    more = _exhaust_goes_on(name, cmd, request, reply)
                    reply_id = next(_request_ids)
                    # Like mongod, a compressed request gets a reply in its own compressor.
                    write(
                        wire.encode_reply(
                            request,
                            reply,
                            request_id=reply_id,
                            more_to_come=more,
                            compressor=request.compressor_id,
                        )
                    )
                    # A small reply is usually sent whole by write(): waiting on the flow
                    # control (a coroutine per reply) only when some of it is still queued.
                    if transport.get_write_buffer_size() or transport.is_closing():
                        await writer.drain()
                    # (more is only ever an OP_MSG's: _exhaust_goes_on)
                    if more and isinstance(request, wire.OpMsg):
                        rest = await _stream_exhaust(
                            state, conn, name, cmd, reply, request, reply_id, writer, read
                        )
                        if rest is None:
                            return  # the client closed the connection during the stream
                        pending += rest
                finally:
                    conn.command = None
            if frames.error is not None:
                raise frames.error  # after answering what came before it


class _IdleWatch:
    """[server] idle_connection_timeout_s for one connection: one loop timer that is moved on
    lazily (not a timeout set and cancelled around every read). Only the wait for the next
    request counts: a command that runs long (an awaitData getMore) is not idleness."""

    __slots__ = ("expired", "idle_s", "loop", "reading_since", "task", "timer")

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.reading_since: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.expired = False

    async def read(self, read: Callable[[int], Awaitable[bytes]]) -> bytes:
        self.reading_since = now = self.loop.time()
        if self.timer is None:
            self.timer = self.loop.call_at(now + self.idle_s, self._check)
        try:
            return await read(256 * 1024)
        finally:
            self.reading_since = None

    def _check(self) -> None:
        self.timer = None
        since = self.reading_since
        if since is None:
            return  # a command is running: armed again when the next read starts
        due = since + self.idle_s
        if self.loop.time() >= due:
            self.expired = True
            if self.task is not None:
                self.task.cancel()
        else:
            self.timer = self.loop.call_at(due, self._check)


def _exhaust_goes_on(
    name: str, cmd: Mapping[str, Any], request: wire.Request, reply: Mapping[str, Any]
) -> bool:
    """Whether mongod would answer this request with moreToCome and run it again on its own
    (the command set its reply builder's next invocation, and the reply succeeded): an OP_MSG
    with exhaustAllowed that is a getMore whose cursor is still open, or an awaitable hello
    (topologyVersion + maxAwaitTimeMS: replication_info.cpp, cluster_hello_cmd.cpp)."""
    if not isinstance(request, wire.OpMsg) or not request.exhaust_allowed:
        return False
    if not isinstance(reply, dict) or reply.get("ok", 1) != 1:
        return False
    if name in _HELLO:
        return "maxAwaitTimeMS" in cmd and "topologyVersion" in reply
    if name != "getMore":
        return False
    cursor = reply.get("cursor")
    return isinstance(cursor, dict) and bool(cursor.get("id"))


def _check_exhaust_hello(
    state: ServerState, name: str, cmd: Mapping[str, Any], request: wire.Request,
    reply: Mapping[str, Any],
) -> Mapping[str, Any]:
    """mongod's CmdHello under exhaust (opCtx->isExhaust(): the OP_MSG's exhaustAllowed) with
    no maxAwaitTimeMS fails with 51756 once the rest of hello has run."""
    if (
        name in _HELLO and isinstance(request, wire.OpMsg) and request.exhaust_allowed
        and reply.get("ok", 1) == 1 and "maxAwaitTimeMS" not in cmd
    ):
        err = MongoError(
            51756, "An isMaster or hello request with exhaust must specify 'maxAwaitTimeMS'"
        )
        return error_reply(state, err, False)
    return reply


async def _run_watching(
    state: ServerState, conn: ConnectionState, cmd: dict[str, Any],
    read: Callable[[int], Awaitable[bytes]],
) -> tuple[Mapping[str, Any] | None, bytes]:
    """Run an awaitable hello (it waits up to maxAwaitTimeMS) while watching the connection,
    as mongod's hello marks itself killed on client disconnect: (its reply, what the client
    sent meanwhile, to be read next), or (None, b"") when the client closed the connection
    (a driver closing its monitor): then no task lingers on it for the rest of the wait."""
    run = asyncio.ensure_future(run_command(state, conn, cmd))
    peek = asyncio.ensure_future(read(256 * 1024))
    try:
        await asyncio.wait((run, peek), return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            sent = _read_result(peek)
            if not sent:
                return None, b""
            return await run, sent  # a request sent early: read once this one is answered
        if not peek.done():
            peek.cancel()  # (a read waiting for data takes none when cancelled)
            await asyncio.wait((peek,))
        return run.result(), _read_result(peek)
    finally:
        for task in (run, peek):
            if not task.done():
                task.cancel()
                await asyncio.wait((task,))  # (our own cancellation still propagates)


def _read_result(task: asyncio.Future[bytes]) -> bytes:
    """What a finished read got: b"" when it was cancelled, or the connection failed (the
    next read or write notices that)."""
    if task.cancelled() or task.exception() is not None:
        return b""
    return task.result()


def _next_invocation(
    name: str, cmd: dict[str, Any], reply: Mapping[str, Any]
) -> dict[str, Any]:
    """The command an exhaust stream runs next (mongod's setNextInvocation): a getMore the
    same; a hello the same with the reply's topologyVersion, the one its next wait uses."""
    if name in _HELLO and reply.get("topologyVersion") != cmd.get("topologyVersion"):
        return {**cmd, "topologyVersion": reply["topologyVersion"]}
    return cmd


async def _stream_exhaust(
    state: ServerState, conn: ConnectionState, name: str, cmd: dict[str, Any],
    reply: Mapping[str, Any], request: wire.OpMsg, reply_id: int,
    writer: asyncio.StreamWriter,
    read: Callable[[int], Awaitable[bytes]],
) -> bytes | None:
    """The rest of an exhaust stream: the command run again, each reply a response to the one
    before it, with moreToCome until it ends (a getMore's cursor exhausted, or a reply that
    failed: that one without). A hello's stream goes on while the client reads it, one reply
    per topology change or maxAwaitTimeMS, and ends when the client closes the connection
    (None); otherwise what the client sent meanwhile, to be read next."""
    awaitable = name in _HELLO
    pending = b""
    while True:
        cmd = _next_invocation(name, cmd, reply)
        if awaitable:
            conn.command = None  # a monitor's wait: not work in flight
            got, sent = await _run_watching(state, conn, cmd, read)
            pending += sent
            if got is None:
                return None
            reply = got
        else:
            conn.command = name
            reply = await run_command(state, conn, cmd)
        more = _exhaust_goes_on(name, cmd, request, reply)
        previous, reply_id = reply_id, next(_request_ids)
        msg = wire.encode_op_msg(
            reply, request_id=reply_id, response_to=previous,
            flags=wire.MORE_TO_COME if more else 0, checksum=request.checksum_present,
        )
        if request.compressor_id is not None:
            msg = wire.compress_message(msg, request.compressor_id)
        writer.write(msg)
        await writer.drain()  # the client reads at its own pace: each reply waits for room
        if not more:
            return pending


def _parse_error_reply(frame: wire.Frame, exc: wire.ProtocolError) -> bytes:
    """The error reply to a request that could be framed but not parsed (uncompressed)."""
    op_code = frame.op_code
    if op_code == wire.OpCode.COMPRESSED:  # the opcode it wraps
        op_code = int.from_bytes(frame.data[16:20], "little", signed=True)
    doc = exc.to_error_document()
    rid = next(_request_ids)
    assert exc.request_id is not None
    if op_code == wire.OpCode.QUERY:
        return wire.encode_op_reply(doc, request_id=rid, response_to=exc.request_id)
    return wire.encode_op_msg(doc, request_id=rid, response_to=exc.request_id)


def _command_of(request: wire.Request) -> dict[str, Any]:
    if isinstance(request, wire.OpQuery):
        return request.to_command()  # unwraps $query, keeps $readPreference, adds $db
    return request.body


def unix_socket_path(prefix: str, port: int) -> str:
    """mongod's makeUnixSockPath: <prefix>/mongodb-<port>.sock (the bound port: with port 0,
    the one the system picked, so servers side by side never share a file)."""
    return os.path.join(prefix, f"mongodb-{port}.sock")


def server_for_config(state: ServerState, config: Config) -> Server:
    """A Server with [auth], [tls] and the connection limits of `config` (raises ValueError
    on a bad user, role or certificate)."""
    from cdcserver.tls import server_context

    auth = config.auth
    try:
        if auth.enabled or auth.users:
            state.auth = ServerAuth(auth)  # users authenticate even when checks are off
        ssl_context = server_context(config.tls)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    state.max_message_bytes = config.server.max_message_bytes
    state.slow_s = config.log.slow_ms / 1000
    state.config = config  # getCmdLineOpts's parsed options
    state.configured_release = RELEASES[config.server.compatibility]
    return Server(
        state,
        config.server.max_connections,
        ssl_context=ssl_context,
        idle_timeout_s=config.server.idle_connection_timeout_s,
        unix_socket_prefix=(
            config.server.unix_socket_prefix if config.server.unix_socket else None
        ),
        unix_socket_permissions=unix_socket_mode(config.server.unix_socket_permissions) or 0,
    )


async def serve_forever(config: Config, deployment: Deployment) -> None:
    state = server_state(
        deployment,
        set_name=config.server.set_name,
        advertised_host=config.server.advertised_host or None,
    )
    state.cursors.idle_timeout_s = config.server.idle_cursor_timeout_s
    state.argv = list(sys.argv)  # getCmdLineOpts's argv
    failpoints.set_enabled(state, config.server.enable_fail_points)
    server = server_for_config(state, config)
    await deployment.start(config.server.host)  # a cluster's shards listen first
    endpoint = None
    mc = config.metrics
    if mc.enabled:  # before the wire listener: "listening on" means everything is up
        from cdcserver.metrics import Metrics, MetricsEndpoint

        metrics = Metrics(state, in_flight=lambda: len(server.in_flight()))
        state.metrics = metrics
        endpoint = MetricsEndpoint(metrics)
        try:
            await endpoint.start(mc.host, mc.port)
        except OSError as exc:
            raise StartupError(
                f"metrics.port: cannot listen on {mc.host}:{endpoint.port}: "
                f"{exc.strerror or exc}"
            ) from None
    sc = config.server
    # What startup made (modules, a recorded oplog's index of bytes and timestamps) lives as
    # long as the process: frozen, the cyclic GC stops rescanning it on every full collection
    # (measured: ~20% of the change-stream delivery time with a 50k-entry file). A batch of
    # queued events is thousands of live objects: at the default 700 the young collections
    # rescanned them over and over (another ~20%); at 10k they are rare.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    try:
        await server.start(sc.host, sc.port)
    except StartupError:  # the Unix domain socket's
        if endpoint is not None:
            await endpoint.close()
        raise
    except OSError as exc:
        if endpoint is not None:
            await endpoint.close()
        if exc.errno == errno.EADDRINUSE:  # taken since `serve` checked it (cli.ports_taken)
            raise StartupError(port_in_use("server.port", "--port", sc.host, sc.port)) from None
        raise StartupError(
            f"server.port: cannot listen on {sc.host}:{sc.port}: {exc.strerror or exc}"
        ) from None
    if endpoint is not None:  # logged once both listen: no line for a server that never ran
        log.info("metrics on http://%s:%d/metrics", mc.host, endpoint.port,
                 extra={"host": mc.host, "port": endpoint.port})
    log.info("%s", serving_summary(config, deployment.oplog, state.port,
                                   endpoint.port if endpoint is not None else None))
    stop = asyncio.Event()
    signals: list[int] = []

    def on_signal(signum: int) -> None:
        signals.append(signum)
        name = signal.Signals(signum).name
        if len(signals) > 1:
            log.warning("%s during shutdown: exiting now", name, extra={"signal": name})
            for handler in logging.getLogger().handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
            os._exit(128 + signum)  # at once: no grace, no store flush (its commits are durable)
        log.info("%s: shutting down (grace %.1fs)", name, sc.shutdown_grace_s,
                 extra={"signal": name})
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)
    await stop.wait()
    await server.shutdown(sc.shutdown_grace_s)
    await deployment.stop()
    if endpoint is not None:
        await endpoint.close()
    log.info("shutdown complete")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on uvloop where it is installed (not on Windows: pyproject.toml), else on
    asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def run_server(config: Config, deployment: Deployment) -> int:
    try:
        run_loop(serve_forever(config, deployment))
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return 48  # mongod's exit code when it cannot listen (ExitCode::netError)
    finally:
        deployment.close()  # commits what its stores have pending and closes their files
    return 0
