"""What every command family shares: the handler type, a family's own table, `int_arg`.

A family (handshake, cursors, writes, queries, ddl, ...) lists its commands in its own `TABLE`;
each serving mode's table is assembled from those next to its mode, in `cdcserver/deployments/`.
A family never reads another family's table: it calls the other's functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdcserver.commands import arguments
from cdcserver.context import Handler

__all__ = ["Handler", "family", "int_arg"]


def family(table: dict[str, Handler]) -> Callable[..., Callable[[Handler], Handler]]:
    """A decorator listing a handler in its family's `table` under one or more names (the
    family's own table only: which modes serve it is decided
    in cdcserver/deployments/)."""

    def command(*names: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            for name in names:
                table[name] = handler
            return handler

        return register

    return command


def int_arg(cmd: Any, name: str, where: str, default: Any = None) -> Any:
    """A numeric command argument (IDL `safeInt64`) as int (`default` when absent or null), or
    mongod's 14; NaN and infinities convert as mongod's safeNumberLong does."""
    return arguments.safe_int_arg(cmd, name, where, default)
