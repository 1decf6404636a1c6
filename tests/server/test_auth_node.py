"""The Node.js driver (npm `mongodb`, tests/node) authenticates to cdcserver with SCRAM-SHA-256
and SCRAM-SHA-1, over TLS too, and is refused as mongod refuses it (18, 13).

tests/node/auth.mjs connects, prints connectionStatus's authInfo, watches a collection,
writes to it and prints the event it saw (or the error). The `node_driver` fixture
(tests/conftest.py) installs the driver when it is missing; skipped where node or npm is absent.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest
import trustme
from bson import json_util

from cdcserver.config import AuthConfig, Config, TlsConfig
from cdcserver.testing import EmbeddedServer
from tests.server.test_auth import make_user

NODE_DIR = pathlib.Path(__file__).parent.parent / "node"
NODE = shutil.which("node")
CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
TIMEOUT_S = 60  # a hang guard only

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed: the Node.js driver test needs Node.js >= 20.19"
)
USERS = [
    make_user("writer", "w-pass", "readWrite@shop"),
    make_user("reader", "r-pass", "read@shop"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory, node_driver):
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("pki")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return d


@pytest.fixture(scope="module")
def server(pki):
    config = Config(
        auth=AuthConfig(enabled=True, users=USERS),
        tls=TlsConfig(enabled=True, certificate_file=str(pki / "server.pem")),
    )
    with EmbeddedServer(config=config) as server:
        yield server


def run_node(server, pki, user, password, mechanism, coll, doc_id):
    uri = (f"mongodb://{user}:{password}@{server.address}/?directConnection=true"
           f"&authMechanism={mechanism}&tls=true&tlsCAFile={pki / 'ca.pem'}")
    config = {"uri": uri, "db": "shop", "coll": coll, "id": doc_id}
    out = subprocess.run(
        [NODE, str(NODE_DIR / "auth.mjs"), json_util.dumps(config, json_options=CANONICAL)],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=NODE_DIR, check=True,
    ).stdout
    return [json_util.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_node_driver_authenticates_and_watches(server, pki, mechanism):
    lines = run_node(server, pki, "writer", "w-pass", mechanism, "node", mechanism)
    assert lines[0] == {"authInfo": {
        "authenticatedUsers": [{"user": "writer", "db": "admin"}],
        "authenticatedUserRoles": [{"role": "readWrite", "db": "shop"}],
    }}
    event = lines[1]["event"]
    assert event["operationType"] == "insert"
    assert event["documentKey"] == {"_id": mechanism}


def test_node_driver_wrong_password_fails_with_18(server, pki):
    lines = run_node(server, pki, "writer", "nope", "SCRAM-SHA-256", "node", "x")
    assert lines[0]["error"]["code"] == 18, json.dumps(lines[0], default=str)


def test_node_driver_outside_its_roles_fails_with_13(server, pki):
    lines = run_node(server, pki, "reader", "r-pass", "SCRAM-SHA-256", "node", "x")
    assert lines[0]["authInfo"]["authenticatedUsers"] == [{"user": "reader", "db": "admin"}]
    error = lines[1]["error"]  # read@shop: the stream opens, the insert is refused
    assert error["code"] == 13 and error["codeName"] == "Unauthorized"
    assert error["errmsg"].startswith('not authorized on shop to execute command { insert: "node"')
