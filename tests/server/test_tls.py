"""TLS on the wire listener, with certificates made for the test (trustme): pymongo connects
with `tls=true` and authenticates with SCRAM-SHA-256 and SCRAM-SHA-1 over it, watch() works,
wrong credentials still fail with 18, and client certificates are verified when asked for."""

from __future__ import annotations

import contextlib
import socket
import ssl

import pymongo
import pytest
import trustme
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

from cdcserver.config import AuthConfig, Config, TlsConfig
from cdcserver.server import StartupError
from cdcserver.testing import EmbeddedServer
from tests.server.test_auth import make_user

USERS = [
    make_user("reader", "r-pass", "read@shop"),
    make_user("writer", "w-pass", "readWrite@shop"),
]


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture(scope="module")
def pki(ca, tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client = ca.issue_cert("client@example.com")
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    other_ca = trustme.CA()
    stranger = other_ca.issue_cert("stranger@example.com")
    stranger.private_key_and_cert_chain_pem.write_to_path(str(d / "stranger.pem"))
    return d


def tls_config(pki, **tls) -> Config:
    return Config(
        auth=AuthConfig(enabled=True, users=USERS),
        tls=TlsConfig(enabled=True, certificate_file=str(pki / "server.pem"), **tls),
    )


@pytest.fixture(scope="module")
def server(pki):
    with EmbeddedServer(config=tls_config(pki)) as server:
        yield server


def tls_client(server, pki, **kwargs) -> pymongo.MongoClient:
    kwargs.setdefault("serverSelectionTimeoutMS", 5000)
    return pymongo.MongoClient(
        server.direct_uri, tls=True, tlsCAFile=str(pki / "ca.pem"), **kwargs
    )


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_scram_over_tls(server, pki, mechanism):
    with (
        tls_client(server, pki, username="reader", password="r-pass",
                   authMechanism=mechanism) as reader,
        tls_client(server, pki, username="writer", password="w-pass",
                   authMechanism=mechanism) as writer,
    ):
        with reader.shop.orders.watch(max_await_time_ms=50) as stream:
            writer.shop.orders.insert_one({"_id": mechanism})
            assert stream.next()["documentKey"] == {"_id": mechanism}
        with pytest.raises(OperationFailure) as excinfo:
            reader.other.orders.watch()
        assert excinfo.value.code == 13
    with tls_client(server, pki, username="reader", password="bad",
                    authMechanism=mechanism) as client:
        with pytest.raises(OperationFailure) as excinfo:
            client.shop.orders.find_one()
        assert excinfo.value.code == 18


def test_uri_options(server, pki):
    uri = (f"mongodb://reader:r-pass@{server.address}/?tls=true&tlsCAFile={pki / 'ca.pem'}"
           "&authSource=admin&authMechanism=SCRAM-SHA-256&directConnection=true")
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
        assert client.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == [
            {"user": "reader", "db": "admin"}
        ]
    with tls_client(server, pki) as anonymous:  # TLS alone is not authentication
        with pytest.raises(OperationFailure) as excinfo:
            anonymous.shop.orders.find_one()
        assert excinfo.value.details["errmsg"] == "Command find requires authentication"


def test_plaintext_client_is_refused_and_server_goes_on(server, pki):
    with pymongo.MongoClient(server.direct_uri, serverSelectionTimeoutMS=500) as plain:
        with pytest.raises(ServerSelectionTimeoutError):
            plain.admin.command("ping")
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01garbage that is not a TLS handshake" * 10)
        with contextlib.suppress(OSError):
            sock.recv(1024)  # a TLS alert or a close; what matters is what follows
    with tls_client(server, pki, username="reader", password="r-pass") as client:
        assert client.shop.orders.find_one({"_id": "none"}) is None


def test_untrusted_server_certificate_is_refused_by_the_driver(server, pki):
    with pymongo.MongoClient(server.direct_uri, tls=True, serverSelectionTimeoutMS=500) as c:
        with pytest.raises(ServerSelectionTimeoutError):
            c.admin.command("ping")  # the system CAs do not know the test CA


def test_client_certificates(pki):
    config = tls_config(pki, ca_file=str(pki / "ca.pem"), require_client_certificate=True)
    with EmbeddedServer(config=config) as server:
        with tls_client(server, pki, tlsCertificateKeyFile=str(pki / "client.pem"),
                        username="reader", password="r-pass") as client:
            assert client.shop.orders.find_one({"_id": "none"}) is None
        for extra in ({}, {"tlsCertificateKeyFile": str(pki / "stranger.pem")}):
            with tls_client(server, pki, serverSelectionTimeoutMS=500, **extra) as client:
                with pytest.raises(ServerSelectionTimeoutError):
                    client.admin.command("ping")
    optional = tls_config(pki, ca_file=str(pki / "ca.pem"))
    with EmbeddedServer(config=optional) as server:
        with tls_client(server, pki, username="reader", password="r-pass") as client:
            assert client.admin.command("ping")["ok"] == 1.0


def test_bad_tls_config_is_refused_at_start(pki, tmp_path):
    missing = tmp_path / "missing.pem"
    for tls, message in [
        (TlsConfig(enabled=True), "tls.certificate_file: required"),
        (TlsConfig(enabled=True, certificate_file=str(missing)), "tls.certificate_file/key_file"),
        (TlsConfig(enabled=True, certificate_file=str(pki / "server.pem"),
                   require_client_certificate=True), "needs tls.ca_file"),
    ]:
        with pytest.raises(StartupError, match=message):
            EmbeddedServer(config=Config(tls=tls))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
def test_tls_handshake_needs_at_least_tls12(server, pki):
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        with pytest.raises(ssl.SSLError):
            context.wrap_socket(sock, server_hostname="127.0.0.1")
