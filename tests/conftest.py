import pathlib

import pytest

# Real cdcserver instances on free ports for the driver tests (tests/test_server*.py).
pytest_plugins = ["cdcserver.testing"]

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} (the shared corpus and reference) is not present")
    return SHARED


# The embedded store most tests/test_embedded_*.py share: one in-memory server per test module
# and a pymongo client per test. A module that needs other settings defines its own `server`
# (the client below then connects to that one).
@pytest.fixture(scope="module")
def server():
    # Imported here: importing cdcserver.testing at module level would precede its
    # registration as a plugin (pytest_plugins above), and lose assertion rewriting.
    from embedded_support import EmbeddedServer

    s = EmbeddedServer()
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = server.client()
    yield c
    c.close()
