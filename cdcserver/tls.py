"""The listener's TLS context from `[tls]` (what mongod's net.tls options do), and the
listener that requires it (a plaintext client is logged, as mongod logs it)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from cdcserver.config import TlsConfig


class TlsConfigError(ValueError):
    pass


def server_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """An SSLContext for the wire listener, or None when TLS is off.

    TLS 1.2 at least (mongod 8.0 refuses 1.0/1.1 by default). With `ca_file`, client
    certificates are asked for and verified against it; `require_client_certificate`
    refuses clients without one (mongod's `allowConnectionsWithoutCertificates` false).
    """
    if not tls.enabled:
        return None
    if not tls.certificate_file:
        raise TlsConfigError("tls.certificate_file: required when tls.enabled is true")
    if tls.require_client_certificate and not tls.ca_file:
        raise TlsConfigError("tls.require_client_certificate: needs tls.ca_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.certificate_file, tls.key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"tls.certificate_file/key_file: {exc}") from None
    if tls.ca_file:
        try:
            context.load_verify_locations(cafile=tls.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"tls.ca_file: {exc}") from None
        context.verify_mode = (
            ssl.CERT_REQUIRED if tls.require_client_certificate else ssl.CERT_OPTIONAL
        )
    return context


# -- the listener with TLS required -------------------------------------------------------------

# mongod's error for a client that does not start TLS where TLS is required
# (asio_session_impl.cpp, maybeHandshakeSSLForIngress: SSLHandshakeFailed), logged once for the
# connection as its session workflow logs a request it cannot receive (session_workflow.cpp,
# id 22988, INFO), and the connection is closed.
PLAINTEXT_ERROR_CODE = 141  # SSLHandshakeFailed
PLAINTEXT_ERROR = "The server is configured to only allow SSL connections"
RECEIVE_ERROR = "Error receiving request from client. Ending connection from remote"
HEADER_BYTES = 16  # a wire message header: mongod looks at its responseTo to tell TLS apart
FIRST_BYTES_TIMEOUT_S = 60.0  # a client that sends nothing is closed after this, unlogged
HANDSHAKE_TIMEOUT_S = 60.0  # asyncio's default

OnConnection = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def tcp_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for `host:port`, bound as asyncio.start_server binds them (each
    address `host` resolves to, SO_REUSEADDR, IPv6 sockets IPv6 only)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)  # OSError EADDRINUSE: the caller names the port
            sock.listen(100)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def unix_socket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(100)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _readable(conn: socket.socket, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        async with asyncio.timeout(max(0.0, timeout)):
            await ready
    finally:
        loop.remove_reader(fd)


async def _peek(conn: socket.socket, n: int, timeout: float) -> bytes:
    """The first `n` bytes the client sent, left unread (fewer: it closed first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        await _readable(conn, deadline - loop.time())
        try:
            data = conn.recv(n, socket.MSG_PEEK)
        except BlockingIOError:
            continue
        if len(data) >= n or not data:
            return data
        if loop.time() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.005)  # the rest of the header is on its way: no busy wait


def _close_socket(sock: socket.socket, _task: object) -> None:
    sock.close()


class TlsListener:
    """The wire listener where TLS is required. asyncio.start_server(ssl=...) drops a
    client whose handshake fails without a word, so a client that forgot `tls=true` left no
    trace. This one accepts itself and, as mongod does, looks at the first 16 bytes without
    reading them: a wire message header (responseTo 0 or -1) is a plaintext client, logged
    once (`on_plaintext(address)`) and closed; anything else goes to the loop's TLS (its
    handshake, then `on_connection` with streams, as start_server would call it).

    As an asyncio Server to its owner: `sockets`, `close()` (stop accepting), `wait_closed()`.
    """

    def __init__(
        self,
        sockets: list[socket.socket],
        context: ssl.SSLContext,
        on_connection: OnConnection,
        on_plaintext: Callable[[Any], None],
    ) -> None:
        self.sockets = sockets
        self.context = context
        self.on_connection = on_connection
        self.on_plaintext = on_plaintext
        loop = asyncio.get_running_loop()
        self._accepting = [loop.create_task(self._accept(sock)) for sock in sockets]
        self._starting: set[asyncio.Task[None]] = set()  # connections not handed over yet

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError:  # out of descriptors, a reset before accept: go on
                await asyncio.sleep(0.01)
                continue
            task = loop.create_task(self._start(conn, address))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start(self, conn: socket.socket, address: Any) -> None:
        try:
            head = await _peek(conn, HEADER_BYTES, FIRST_BYTES_TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.CancelledError):
            conn.close()
            return
        if len(head) < HEADER_BYTES:  # closed before a whole header (a port probe)
            conn.close()
            return
        if int.from_bytes(head[8:12], "little", signed=True) in (0, -1):
            self.on_plaintext(address)
            with contextlib.suppress(OSError):
                conn.recv(1 << 16)  # what it sent, read: the close is a FIN, not a reset
            conn.close()
            return
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader, self.on_connection)
        try:
            await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self.context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            )
        except (OSError, asyncio.CancelledError):  # a failed handshake: the client is told
            conn.close()

    def close(self) -> None:
        """Stop accepting; connections already served go on (as asyncio's Server)."""
        for task in self._starting:
            task.cancel()
        for task, sock in zip(self._accepting, self.sockets, strict=True):
            # Closed once the accept is cancelled: its reader is removed first.
            task.add_done_callback(functools.partial(_close_socket, sock))
            task.cancel()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, return_exceptions=True)
