"""The CRUD commands, split along mongod's seams: write commands in `writes.py`, queries
(find, count, distinct, aggregate, their cursors) in `queries.py`, what both check alike in
`crud_common.py`, sessions and transactions in `transactions.py`. This module only keeps the
old names importable (tests); nothing in cdcserver imports it."""

from __future__ import annotations

from cdcserver.commands.queries import (  # noqa: F401
    ResultCursor,
    aggregate,
    count,
    cursor_first_batch,
    distinct,
    find,
    find_documents,
    run_find,
)
from cdcserver.commands.writes import (  # noqa: F401
    delete,
    find_and_modify,
    insert,
    prepare_insert,
    update,
)
from pipeline_stages.errors import MongoError  # noqa: F401
