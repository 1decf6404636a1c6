"""Which namespaces a sidecar materializes: `[upstream] materialize = ["shop.*", "crm.accounts"]`.

A pattern is `db.coll` (that collection) or `db.*` (every collection of `db`). Names are
checked as mongod checks them (no `$`, no NUL, a database name without `/\\. "`), so a typo is
a config error at start rather than a namespace that never matches. `system.*` collections and
the `admin`, `local` and `config` databases are never materialized (the upstream's own state).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

INTERNAL_DBS = frozenset({"admin", "local", "config"})
_BAD_DB_CHARS = set('/\\. "$\0')


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not a valid materialize pattern (None: it is)."""
    db, dot, coll = pattern.partition(".")
    if not dot or not db or not coll:
        return f"{pattern!r} is not db.coll or db.*"
    if _BAD_DB_CHARS & set(db):
        return f"{pattern!r}: the database name {db!r} has a character mongod refuses"
    if db in INTERNAL_DBS:
        return f"{pattern!r}: the {db} database is the upstream's own state"
    if coll == "*":
        return None
    if "*" in coll:
        return f"{pattern!r}: '*' stands only for a whole collection name (db.*)"
    if "$" in coll or "\0" in coll:
        return f"{pattern!r}: the collection name {coll!r} has a character mongod refuses"
    if coll.startswith("system."):
        return f"{pattern!r}: system collections are not materialized"
    return None


class Patterns:
    """A set of patterns, matched against (db, coll)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns: Sequence[str] = tuple(patterns)
        for pattern in self.patterns:
            problem = pattern_problem(pattern)
            if problem is not None:
                raise ValueError(problem)
        self.whole_dbs = frozenset(p[:-2] for p in self.patterns if p.endswith(".*"))
        self.exact = frozenset(
            tuple(p.split(".", 1)) for p in self.patterns if not p.endswith(".*")
        )

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def databases(self) -> set[str]:
        return set(self.whole_dbs) | {db for db, _ in self.exact}

    def matches(self, db: str, coll: str) -> bool:
        if coll.startswith("system.") or db in INTERNAL_DBS:
            return False
        return db in self.whole_dbs or (db, coll) in self.exact

    def matches_ns(self, ns: str) -> bool:
        db, _, coll = ns.partition(".")
        return self.matches(db, coll)
