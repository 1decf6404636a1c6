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
