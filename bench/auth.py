"""Connection setup rate: connect + hello + authenticate + one ping, a fresh connection each
time, against a real `cdcserver serve` process with `[auth] enabled = true`.

Four setups, each as a ratio to the unauthenticated plaintext rate measured in the same run
(plain: hello + ping, which mongod allows before authentication):

  plain | plain + SCRAM-SHA-256 | plain + SCRAM-SHA-1 | TLS | TLS + SCRAM-SHA-256 | ...

The client speaks the wire protocol itself (a socket, OP_MSG), the way drivers do it: SCRAM
rides in hello's speculativeAuthenticate, then one saslContinue with skipEmptyExchange. The
server never runs PBKDF2 (it keeps StoredKey/ServerKey); the client does, once per
credential, and caches the salted password as pymongo does. So the iteration count (mongod's
defaults: 15000 for SHA-256, 10000 for SHA-1; printed) costs a client's first connection,
shown separately as "uncached". Prints only; not a test.

`python bench/auth.py [--connections N] [--rounds R]`
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import itertools
import os
import pathlib
import socket
import ssl
import struct
import sys
import tempfile
import time
from typing import Any

import bson

from cdcserver import auth
from cdcserver.testing import SubprocessServer

_ids = itertools.count(1)
PASSWORD = "bench-password"


def op_msg(doc: dict[str, Any]) -> bytes:
    body = bson.encode(doc)
    return struct.pack("<iiii", 21 + len(body), next(_ids), 0, 2013) + b"\0\0\0\0\0" + body


def recv_exact(sock: Any, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def command(sock: Any, doc: dict[str, Any]) -> dict[str, Any]:
    sock.sendall(op_msg(doc))
    (length,) = struct.unpack("<i", recv_exact(sock, 4))
    rest = recv_exact(sock, length - 4)
    reply = bson.decode(rest[17:])  # header rest (12) + flags (4) + section kind (1)
    if reply.get("ok") != 1:
        raise RuntimeError(reply)
    return reply


class ScramClient:
    """SCRAM's client side, with the salted-password cache drivers keep."""

    def __init__(self, user: str, mechanism: str, cache: bool) -> None:
        self.user, self.mechanism, self.cache = user, mechanism, cache
        self.hash = "sha256" if mechanism == auth.SCRAM_SHA_256 else "sha1"
        self.password = auth.scram_password(mechanism, user, PASSWORD)
        self.keys: dict[tuple[str, int], tuple[bytes, bytes]] = {}

    def start(self) -> tuple[dict[str, Any], str]:
        nonce = base64.b64encode(os.urandom(24)).decode()
        bare = f"n={self.user},r={nonce}"
        spec = {"saslStart": 1, "mechanism": self.mechanism, "payload": f"n,,{bare}".encode(),
                "options": {"skipEmptyExchange": True}, "db": "admin"}
        return spec, bare

    def final(self, bare: str, server_first: bytes) -> bytes:
        fields = dict(kv.split("=", 1) for kv in server_first.decode().split(","))
        key = (fields["s"], int(fields["i"]))
        if key not in self.keys or not self.cache:
            salted = hashlib.pbkdf2_hmac(self.hash, self.password, base64.b64decode(key[0]),
                                         key[1])
            self.keys[key] = (hmac.digest(salted, b"Client Key", self.hash),
                              hmac.digest(salted, b"Server Key", self.hash))
        client_key, _ = self.keys[key]
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{bare},{server_first.decode()},{without_proof}".encode()
        stored = hashlib.new(self.hash, client_key).digest()
        signature = hmac.digest(stored, message, self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def connect_once(port: int, tls: ssl.SSLContext | None, scram: ScramClient | None) -> None:
    raw = socket.create_connection(("127.0.0.1", port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock: Any = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw
    try:
        hello: dict[str, Any] = {"hello": 1, "helloOk": True, "$db": "admin",
                                 "client": {"driver": {"name": "bench", "version": "0"}}}
        if scram is None:
            command(sock, hello)
        else:
            spec, bare = scram.start()
            hello["speculativeAuthenticate"] = spec
            first = command(sock, hello)["speculativeAuthenticate"]
            final = command(sock, {"saslContinue": 1, "conversationId": 1, "$db": "admin",
                                   "payload": scram.final(bare, first["payload"])})
            assert final["done"] is True
        command(sock, {"ping": 1, "$db": "admin"})
    finally:
        sock.close()


def rate(port: int, tls: ssl.SSLContext | None, scram: ScramClient | None, n: int) -> float:
    connect_once(port, tls, scram)  # warm-up (and, cached, the one PBKDF2)
    started = time.perf_counter()
    for _ in range(n):
        connect_once(port, tls, scram)
    return n / (time.perf_counter() - started)


def config_text(tls_dir: pathlib.Path | None) -> str:
    roles = [("read", "bench")]
    text = "[auth]\nenabled = true\n" + auth.user_toml("bench", "admin", roles, PASSWORD)
    if tls_dir is not None:
        text += f'[tls]\nenabled = true\ncertificate_file = "{tls_dir / "server.pem"}"\n'
    return "[metrics]\nenabled = false\n" + text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import trustme  # the test extra

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cdcserver-bench-auth-"))
    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)  # P-256: what a new deployment picks
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp / "server.pem"))
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    (tmp / "plain.toml").write_text(config_text(None))
    (tmp / "tls.toml").write_text(config_text(tmp))
    n = args.connections
    print(f"connections per setup: {n}; iterations: SCRAM-SHA-256 "
          f"{auth.DEFAULT_ITERATIONS[auth.SCRAM_SHA_256]}, SCRAM-SHA-1 "
          f"{auth.DEFAULT_ITERATIONS[auth.SCRAM_SHA_1]} (mongod's defaults)")
    with (
        SubprocessServer(extra_args=["--config", str(tmp / "plain.toml")]) as plain,
        SubprocessServer(extra_args=["--config", str(tmp / "tls.toml")]) as tls,
    ):
        setups: list[tuple[str, int, ssl.SSLContext | None, ScramClient | None, int]] = []
        for label, port, ctx in (("plain", plain.port, None), ("TLS", tls.port, client_tls)):
            setups.append((label, port, ctx, None, n))
            for mech in (auth.SCRAM_SHA_256, auth.SCRAM_SHA_1):
                setups.append((f"{label} + {mech}", port, ctx, ScramClient("bench", mech, True), n))
            uncached = ScramClient("bench", auth.SCRAM_SHA_256, cache=False)
            setups.append((f"{label} + SCRAM-SHA-256 uncached (client PBKDF2 each time)", port,
                           ctx, uncached, max(10, n // 10)))
        # Interleaved rounds, best of each: other load on the machine hits every setup alike.
        best = [0.0] * len(setups)
        for _ in range(args.rounds):
            for i, (_, port, ctx, scram, count) in enumerate(setups):
                best[i] = max(best[i], rate(port, ctx, scram, max(1, count // args.rounds)))
        limit = best[0]
        print(f"limit: plaintext, no authentication: {limit:,.0f} connections/s")
        for (label, *_), value in zip(setups[1:], best[1:], strict=True):
            print(f"{label:<58} {value:>9,.0f}/s  ratio {value / limit:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
