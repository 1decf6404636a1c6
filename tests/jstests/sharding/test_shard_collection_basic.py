"""Translated from mongodb/mongo `jstests/sharding/shard_collection_basic.js` @
0491f281895741b178e668d98937c2f92f797d25 (the index's one revision, a 4.2-era one), one case
per block: wrong arguments, `admin` only, key formats (no key, `{}`, a bad hashed value,
embedded objects; a dotted path works), idempotency (the same options work again, other ones
fail), which keys need an index (none on an empty collection; one on a non-empty collection;
never a multikey one or parallel arrays), `unique` with a hashed key or a non-unique index,
a session, the collation rules (only the simple collation; a collection default or an index
with another fails unless an index with the simple collation exists or the collection is
empty), and what `sh.shardCollection` sends (`unique`, `collation`, `numInitialChunks`: the
index it creates, the chunks).

Left out, as 8.0 no longer behaves so: "Fail if db is not sharded / not sharding enabled"
(8.0's shardCollection creates the database itself: enableSharding is optional), the 100-byte
namespace limit (255 since 4.4), `{x: "hashed", y: 1}` refused (compound hashed keys since 4.4). Its
`config.collections.count({dropped: false})` are `find({_id})`s (no `dropped` field since 5.0;
count on `config.*` through the front: `test_move_range_basic.py`'s strict xfail), its
`config.chunks.find({ns})` a find by the collection's `uuid`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pymongo.errors import OperationFailure

DB = "db"
NS = f"{DB}.foo"


class Case:
    def __init__(self, st: Any) -> None:
        self.s = st.s
        self.db = self.s[DB]
        self.foo = self.db.foo

    def ok(self, **command: Any) -> None:
        self.s.admin.command({"shardCollection": NS, **command})

    def fails(self, **command: Any) -> None:
        with pytest.raises(OperationFailure):
            self.s.admin.command({"shardCollection": NS, **command})

    def sharded(self, ns: str = NS) -> bool:
        return self.s.config.collections.find_one({"_id": ns}) is not None

    def reset(self) -> None:
        self.s.drop_database(DB)
        self.s.admin.command("enableSharding", DB)

    def no_index_ok(self, key: dict) -> None:
        """`testAndClenaupWithKeyNoIndexOK`."""
        self.s.admin.command("enableSharding", DB)
        assert not self.sharded()
        self.ok(key=key)
        assert self.sharded()
        self.s.drop_database(DB)

    def no_index_fails(self, key: dict) -> None:
        """`testAndClenaupWithKeyNoIndexFailed`."""
        self.s.admin.command("enableSharding", DB)
        self.fails(key=key)
        assert not self.sharded()
        self.s.drop_database(DB)

    def with_index_ok(self, key: dict) -> None:
        """`testAndClenaupWithKeyOK`."""
        self.s.admin.command("enableSharding", DB)
        self.foo.create_index(list(key.items()))
        assert not self.sharded()
        self.ok(key=key)
        assert self.sharded()
        self.s.drop_database(DB)

    def index_spec(self, name: str) -> dict:
        specs = [spec for spec in self.foo.list_indexes() if spec["name"] == name]
        assert len(specs) == 1, f'index "{name}" not found'
        return specs[0]


def wrong_arguments(c: Case) -> None:
    c.s.admin.command("enableSharding", DB)
    with pytest.raises(OperationFailure):
        c.s.admin.command({"shardCollection": "foo", "key": {"_id": 1}})
    with pytest.raises(OperationFailure):
        c.s.admin.command({"shardCollection": "foo", "key": "aaa"})
    with pytest.raises(OperationFailure):
        c.s.test.command({"shardCollection": NS, "key": {"_id": 1}})


def key_formats(c: Case) -> None:
    c.s.admin.command("enableSharding", DB)
    c.foo.insert_one({"a": 1, "b": 1})
    c.fails()
    c.fails(key={})
    c.fails(key={"aKey": "hahahashed"})
    c.fails(key={"_id": {"a": 1}})
    c.fails(key={"_id": {"a.b": 1}})
    c.s.admin.command({"shardCollection": f"{DB}.shard_key_dotted_path", "key": {"_id.a": 1}})


def idempotency(c: Case) -> None:
    c.s.admin.command("enableSharding", DB)
    c.foo.insert_one({"a": 1, "b": 1})
    c.ok(key={"_id": 1})
    c.ok(key={"_id": 1})
    c.ok(key={"_id": 1}, collation={"locale": "simple"})
    c.fails(key={"x": 1})
    c.fails(key={"_id": 1}, unique=True)


def empty_collections_need_no_index(c: Case) -> None:
    for key in ({"_id": 1}, {"_id": "hashed"}, {"a": 1}, {"a": "hashed"}, {"x": 1, "y": 1}):
        c.no_index_ok(key)


def data_needs_an_index(c: Case) -> None:
    for key, doc in (({"a": 1}, {"a": 1, "b": 1}), ({"a": "hashed"}, {"a": 1, "b": 1}),
                     ({"x": 1, "y": 1}, {"x": 1, "y": 1})):
        c.foo.insert_one(dict(doc))
        c.no_index_fails(key)
        c.foo.insert_one(dict(doc))
        c.with_index_ok(key)


def two_hashed_fields(c: Case) -> None:
    c.no_index_fails({"x": "hashed", "y": "hashed"})


def key_components(c: Case) -> None:
    c.with_index_ok({"z.x": 1})
    c.with_index_ok({"z.x": "hashed"})


def multikey(c: Case) -> None:
    c.foo.create_index({"a": 1})
    c.foo.insert_one({"a": [1, 2, 3, 4, 5], "b": 1})
    c.no_index_fails({"a": 1})
    c.foo.create_index({"a": 1, "b": 1})
    c.foo.insert_one({"a": [1, 2, 3, 4, 5], "b": 1})
    c.no_index_fails({"a": 1, "b": 1})
    c.foo.insert_one({"a": 1, "b": 1})
    c.no_index_fails({"a": "hashed"})
    c.foo.insert_one({"a": 1, "b": 1})
    c.with_index_ok({"a": "hashed"})
    c.foo.insert_one({"a": [1, 2, 3, 4, 5], "b": [1, 2, 3, 4, 5]})
    c.no_index_fails({"a": 1, "b": 1})


def unique(c: Case) -> None:
    c.s.admin.command("enableSharding", DB)
    c.fails(key={"aKey": "hashed"}, unique=True)
    c.foo.create_index({"aKey": 1})
    c.fails(key={"aKey": 1}, unique=True)


def session(c: Case) -> None:
    c.reset()
    with c.s.start_session() as s:
        c.s.admin.command({"shardCollection": NS, "key": {"_id": "hashed"}}, session=s)


EN_US = {"locale": "en_US"}
SIMPLE = {"locale": "simple"}


def collation_option(c: Case) -> None:
    c.reset()
    c.fails(key={"_id": 1}, collation={"locale": "unknown"})
    c.ok(key={"_id": 1}, collation=SIMPLE)


def collation_not_an_object(c: Case) -> None:
    c.reset()
    c.fails(key={"_id": 1}, collation=True)


def collation_not_simple(c: Case) -> None:
    c.reset()
    c.fails(key={"_id": 1}, collation=EN_US)


def collation_of_the_collection_or_index(c: Case) -> None:
    c.reset()
    c.db.create_collection("foo", collation=EN_US)
    c.fails(key={"a": 1})
    c.foo.drop()
    c.db.create_collection("foo", collation=EN_US)
    c.fails(key={"_id": 1}, collation=SIMPLE)
    c.foo.drop()
    c.foo.create_index({"a": 1}, collation=EN_US)
    c.fails(key={"a": 1})


def collation_simple_index_found_or_made(c: Case) -> None:
    c.reset()
    c.db.create_collection("foo", collation=EN_US)
    c.ok(key={"a": 1}, collation=SIMPLE)
    assert "collation" not in c.index_spec("a_1")

    c.foo.drop()
    c.foo.create_index({"a": 1}, name="a_1_simple")
    c.foo.create_index({"a": 1}, collation=EN_US, name="a_1_en_US")
    c.ok(key={"a": 1})

    c.foo.drop()
    c.db.create_collection("foo", collation=EN_US)
    c.foo.insert_one({"a": "foo"})
    c.foo.create_index({"a": 1})  # the collection's default collation
    c.fails(key={"a": 1}, collation=SIMPLE)

    c.foo.drop()
    c.db.create_collection("foo", collation=EN_US)
    c.ok(key={"a": 1}, collation=SIMPLE)
    c.foo.drop()
    c.db.create_collection("foo")
    c.ok(key={"a": 1})


def shell_helper_unique(c: Case) -> None:
    """`sh.shardCollection(ns, key, unique, options)`: `{shardCollection, key, unique?,
    ...options}`."""
    c.reset()
    c.db.create_collection("foo")
    c.ok(key={"a": 1})
    spec = c.index_spec("a_1")
    assert "unique" not in spec and "collation" not in spec, spec

    c.foo.drop()
    c.db.create_collection("foo")
    c.ok(key={"a": 1}, unique=True)
    assert c.index_spec("a_1").get("unique") is True

    c.foo.drop()
    c.db.create_collection("foo")
    c.ok(key={"a": 1}, unique=False)
    assert "unique" not in c.index_spec("a_1")


def shell_helper_collation(c: Case) -> None:
    c.reset()
    c.db.create_collection("foo")
    c.fails(key={"a": 1}, unique=False, collation=EN_US)
    c.ok(key={"a": 1}, unique=False, collation=SIMPLE)
    assert "collation" not in c.index_spec("a_1")

    c.foo.drop()
    c.db.create_collection("foo", collation=EN_US)
    c.fails(key={"a": 1})
    c.fails(key={"a": 1}, unique=False, collation=EN_US)
    c.ok(key={"a": 1}, unique=False, collation=SIMPLE)
    assert "collation" not in c.index_spec("a_1")


def shell_helper_num_initial_chunks(c: Case) -> None:
    c.reset()
    c.db.create_collection("foo")
    c.ok(key={"a": "hashed"}, unique=False, numInitialChunks=5)
    uuid = c.s.config.collections.find_one({"_id": NS})["uuid"]
    assert len(list(c.s.config.chunks.find({"uuid": uuid}))) == 5


XFAIL: dict[str, str] = {}


def _param(name: str) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
    return pytest.param(name, id=name, marks=marks)


CASES: dict[str, Callable[[Case], None]] = {f.__name__: f for f in (
    wrong_arguments, key_formats, idempotency, empty_collections_need_no_index,
    data_needs_an_index, two_hashed_fields, key_components, multikey, unique, session,
    collation_option, collation_not_an_object, collation_not_simple,
    collation_of_the_collection_or_index, collation_simple_index_found_or_made,
    shell_helper_unique, shell_helper_collation, shell_helper_num_initial_chunks)}


@pytest.mark.parametrize("case", [_param(name) for name in CASES])
def test_shard_collection_basic(st, case):
    CASES[case](Case(st))
