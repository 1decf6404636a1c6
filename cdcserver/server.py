"""The listener: one asyncio task per connection, on uvloop.

Each connection reads frames (`cdcserver.wire`), runs one command at a time (like mongod, a
connection's requests are answered in order), and writes the reply. A malformed frame closes
that connection only; every other connection goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
from typing import Any

from bson.codec_options import CodecOptions, DatetimeConversion

from cdcserver import wire
from cdcserver.commands import crud as _crud  # noqa: F401  (the embedded store's commands)
from cdcserver.commands import cursors as _cursors  # noqa: F401  (registers commands)
from cdcserver.commands import ddl as _ddl  # noqa: F401
from cdcserver.commands import failpoints
from cdcserver.commands import handshake as _handshake  # noqa: F401
from cdcserver.commands import proxy as _proxy  # noqa: F401  (`serve --upstream` forwarding)
from cdcserver.commands.registry import run_command
from cdcserver.config import Config
from cdcserver.context import ConnectionState, ServerState
from cdcserver.sources.base import OplogLog

log = logging.getLogger("cdcserver")

# Commands arrive as plain dicts (tz-aware dates keep their instant exactly).
REQUEST_CODEC = CodecOptions(tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO)
_request_ids = itertools.count(1)


class Server:
    def __init__(self, state: ServerState, max_connections: int = 10_000) -> None:
        self.state = state
        self.max_connections = max_connections
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._background: list[asyncio.Task[Any]] = []

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._on_connection, host, port)
        sock = self._server.sockets[0]
        bound = sock.getsockname()[1]
        self.state.host, self.state.port = host, bound
        self._background.append(asyncio.create_task(self.state.cursors.reap_forever()))
        follow = getattr(self.state.log, "follow", None)
        if self.state.follow and follow is not None:
            self._background.append(asyncio.create_task(follow()))
        log.info("listening on %s:%d", host, bound)
        return bound

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in [*self._tasks, *self._background]:
            task.cancel()
        for task in [*self._tasks, *self._background]:
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        state = self.state
        peer = writer.get_extra_info("peername")
        peer_str = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if state.connections >= self.max_connections:
            log.warning("connection from %s refused: %d open", peer_str, state.connections)
            writer.close()
            self._tasks.discard(task)
            return
        conn = ConnectionState(state.next_connection_id(), peer_str)
        state.connections += 1
        log.info("connection %d accepted from %s", conn.id, peer_str)
        try:
            await self._serve(conn, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except wire.ProtocolError as exc:
            log.info("connection %d closed: %s", conn.id, exc.errmsg)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection %d failed", conn.id)
        finally:
            state.connections -= 1
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            log.info("connection %d ended", conn.id)

    async def _serve(
        self, conn: ConnectionState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        frames = wire.FrameReader()
        state = self.state
        while True:
            data = await reader.read(256 * 1024)
            if not data:
                return
            for frame in frames.feed(data):
                try:
                    request = wire.decode_request(frame, codec_options=REQUEST_CODEC)
                except wire.ProtocolError as exc:
                    if exc.fatal or exc.request_id is None:
                        raise
                    # mongod answers this request with the error and keeps the connection.
                    writer.write(_parse_error_reply(frame, exc))
                    await writer.drain()
                    continue
                cmd = _command_of(request)
                reply = await run_command(state, conn, cmd)
                if getattr(request, "more_to_come", False):
                    continue  # the client asked for no reply
                # Like mongod, a compressed request gets a reply in its own compressor.
                writer.write(
                    wire.encode_reply(
                        request,
                        reply,
                        request_id=next(_request_ids),
                        compressor=request.compressor_id,
                    )
                )
                await writer.drain()
            if frames.error is not None:
                raise frames.error  # after answering what came before it


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


async def serve_forever(config: Config, oplog: OplogLog) -> None:
    state = ServerState(
        log=oplog,
        set_name=config.server.set_name,
        advertised_host=config.server.advertised_host or None,
    )
    state.cursors.idle_timeout_s = config.server.idle_cursor_timeout_s
    state.follow = config.source.follow
    failpoints.set_enabled(state, config.server.enable_fail_points)
    server = Server(state, config.server.max_connections)
    await server.start(config.server.host, config.server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.close()


def run_server(config: Config, oplog: OplogLog) -> int:
    import uvloop

    uvloop.run(serve_forever(config, oplog))
    return 0
