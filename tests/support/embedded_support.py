"""An embedded-store server in a background thread, for tests driving it with pymongo, and
helpers for tests of commands that wait for a transaction.

EmbeddedServer lives in `cdcserver.testing` (the pytest plugin users get); this module keeps
the old import path working.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from cdcserver.testing import EmbeddedServer

__all__ = [
    "EmbeddedServer", "Outside", "database_for_test", "wait_until_blocked",
]


class Outside(threading.Thread):
    """A command outside a transaction, run in its own thread (it is expected to wait)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc


def wait_until_blocked(server: EmbeddedServer, n: int = 1, guard_s: float = 60.0) -> None:
    """Until the server holds `n` commands waiting for a transaction (ordering, not timing;
    `guard_s` only turns a hang into a failure)."""
    event = threading.Event()
    deadline = time.monotonic() + guard_s
    while server.store.waiting_writes < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {n} command(s) waiting for a transaction")
        event.wait(0.005)


def database_for_test(client: Any, request: Any) -> Any:
    """A database of its own for one test (named after it, dropped first), so tests that share
    a module's server cannot see each other's collections."""
    name = request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:50]
    client.drop_database(name)
    return client[name]

