"""Translated from mongodb/mongo `jstests/sharding/refine_collection_shard_key_basic.js` @
009489e71bbce357b53259d81dc909c7638683e9, its simple, shard-key-validation, uniqueness and
`config.chunks` parts: `refineCollectionShardKey`'s argument types (14), `admin` only (13), a
namespace that does not exist (26) or is not sharded (61), `config.collections` (NoShardingEnabled
203 without a config shard), bad key values (2), no key (40414), an unchanged key (works); a key
that does not extend the current one or has no usable index (72 InvalidOptions, with mongod's
reasons: sparse, partial, multikey, non-simple collation); keys with missing fields, hashed and
dotted fields (work, `config.collections.key` updated, a new epoch); `unique` kept; and the
chunks' bounds extended with MinKey / MaxKey.

Left out: the stale-mongos namespace test (a second mongos and the
`hangRefineCollectionShardKeyAfterRefresh` fail point), the CRUD, split, move and merge checks
through a refined key with its secondary reads (three-node shards), the zone (`config.tags`)
checks and the unrelated collection's (they follow its chunk checks)."""

from __future__ import annotations

from typing import Any

import pytest
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import OperationFailure

DB = "db"
COLL = "foo"
NS = f"{DB}.{COLL}"


def _code(s, command: dict, code: int, *msgs: str, db: str = "admin") -> None:
    with pytest.raises(OperationFailure) as err:
        s[db].command(command)
    assert err.value.code == code, err.value.details
    for msg in msgs:
        assert msg in err.value.details["errmsg"], err.value.details


def _shard(s, key: dict, unique: bool = False) -> None:
    s.admin.command({"enableSharding": DB})
    s[DB].command({"drop": COLL})
    command: dict[str, Any] = {"shardCollection": NS, "key": key}
    if unique:
        command["unique"] = True
    s.admin.command(command)


def _refine(s, key: dict, **extra: Any) -> dict:
    return s.admin.command({"refineCollectionShardKey": NS, "key": key, **extra})


def _config_coll(s) -> dict:
    docs = list(s.config.collections.find({"_id": NS}))
    assert len(docs) == 1, docs
    return docs[0]


def _none(s, coll) -> None:
    pass


def _unsharded(s, coll) -> None:
    coll.insert_one({"aKey": 1})


def _by(key: dict, unique: bool = False) -> Any:
    return lambda s, coll: _shard(s, key, unique)


def _with_index(key: dict, index: dict, *docs: dict, **options: Any) -> Any:
    def setup(s, coll) -> None:
        _shard(s, key)
        coll.create_index(list(index.items()), **options)
        for doc in docs:
            coll.insert_one(dict(doc))
    return setup


def _two_indexes(second: dict, *docs: dict) -> Any:
    def setup(s, coll) -> None:
        _shard(s, {"_id": 1})
        coll.create_index({"_id": 1, "aKey": 1}, name="index_1_part",
                          partialFilterExpression={"aKey": {"$gt": 0}})
        coll.create_index({"_id": 1, "aKey": 1}, **second)
        for doc in docs:
            coll.insert_one(dict(doc))
    return setup


ID_A = {"_id": 1, "aKey": 1}
MULTIKEY = {"aKey": [1, 2, 3, 4, 5]}
# (id, setup, the command's fields after refineCollectionShardKey: NS, code or None (works),
#  messages the errmsg holds, database)
CASES: list[tuple[str, Any, dict, int | None, tuple[str, ...], str]] = [
    ("ns_not_string", _none, {"refineCollectionShardKey": {"_id": 1}, "key": ID_A}, 14, (),
     "admin"),
    ("key_not_object", _none, {"key": "blah"}, 14, (), "admin"),
    ("not_admin", _none, {"key": ID_A}, 13, (), DB),
    ("ns_not_found", _none, {"key": ID_A}, 26, (), "admin"),
    ("not_sharded", _unsharded, {"key": ID_A}, 118, (), "admin"),
    ("config_collections", _none,
     {"refineCollectionShardKey": "config.collections", "key": ID_A}, 203, (), "admin"),
    ("key_value_5", _by({"_id": 1}), {"key": {"_id": 5}}, 2, (), "admin"),
    ("key_value_minus_1", _by({"_id": 1}), {"key": {"_id": -1}}, 2, (), "admin"),
    ("two_hashed", _by({"_id": 1}), {"key": {"_id": "hashed", "aKey": "hashed"}}, 2, (),
     "admin"),
    ("hahashed", _by({"_id": 1}), {"key": {"aKey": "hahashed"}}, 2, (), "admin"),
    ("no_key", _by({"_id": 1}), {}, 40414, (), "admin"),
    ("empty_key", _by({"_id": 1}), {"key": {}}, 2, (), "admin"),
    ("same_id", _by({"_id": 1}), {"key": {"_id": 1}}, None, (), "admin"),
    ("same_a_b", _by({"a": 1, "b": 1}), {"key": {"a": 1, "b": 1}}, None, (), "admin"),
    ("same_hashed", _by({"aKey": "hashed"}), {"key": {"aKey": "hashed"}}, None, (), "admin"),
    ("same_id_hashed", _by({"_id": 1, "aKey": "hashed"}),
     {"key": {"_id": 1, "aKey": "hashed"}}, None, (), "admin"),
    ("does_not_extend", _by({"_id": 1}), {"key": {"aKey": 1}}, 72, (), "admin"),
    ("no_index", _by({"_id": 1}), {"key": ID_A}, 72, (), "admin"),
    ("sparse", _with_index({"_id": 1}, ID_A, sparse=True), {"key": ID_A}, 72,
     ("Index key is sparse.",), "admin"),
    ("collation", _with_index({"aKey": 1}, {"aKey": 1, "bKey": 1}, collation={"locale": "en"}),
     {"key": {"aKey": 1, "bKey": 1}}, 72, ("Index has a non-simple collation.",), "admin"),
    ("partial", _with_index({"_id": 1}, ID_A, partialFilterExpression={"aKey": {"$gt": 0}}),
     {"key": ID_A}, 72, ("Index key is partial.",), "admin"),
    ("multikey", _with_index({"_id": 1}, ID_A, MULTIKEY), {"key": ID_A}, 72,
     ("Index key is multikey.",), "admin"),
    ("longer_index", _with_index({"_id": 1}, {"_id": 1, "aKey": 1, "bKey": 1}), {"key": ID_A},
     None, (), "admin"),
    ("missing_fields", _with_index({"_id": 1}, ID_A, {"_id": 12345}), {"key": ID_A}, None, (),
     "admin"),
    ("missing_fields_hashed_id", _with_index({"_id": "hashed"}, {"_id": "hashed", "aKey": 1},
                                             {"_id": 12345}),
     {"key": {"_id": "hashed", "aKey": 1}}, None, (), "admin"),
    ("missing_fields_hashed_a", _with_index({"_id": 1}, {"_id": 1, "aKey": "hashed"},
                                            {"_id": 12345}),
     {"key": {"_id": 1, "aKey": "hashed"}}, None, (), "admin"),
    ("not_prefix_a", _with_index(ID_A, {"aKey": 1}), {"key": {"aKey": 1}}, 72, (), "admin"),
    ("not_prefix_a_id", _with_index(ID_A, {"aKey": 1, "_id": 1}),
     {"key": {"aKey": 1, "_id": 1}}, 72, (), "admin"),
    ("not_prefix_a_id_b", _with_index(ID_A, {"aKey": 1, "_id": 1, "bKey": 1}),
     {"key": {"aKey": 1, "_id": 1, "bKey": 1}}, 72, (), "admin"),
    ("not_prefix_a_b", _with_index({"_id": 1}, {"aKey": 1, "bKey": 1}),
     {"key": {"aKey": 1, "bKey": 1}}, 72, (), "admin"),
    ("sparse_and_collation", _with_index({"_id": 1}, ID_A, sparse=True,
                                         collation={"locale": "en"}),
     {"key": ID_A}, 72, ("Index key is sparse.", "Index has a non-simple collation."), "admin"),
    ("multikey_and_partial", _two_indexes({"name": "index_2"}, MULTIKEY), {"key": ID_A}, 72,
     ("Index key is multikey.", "Index key is partial."), "admin"),
    ("partial_and_sparse", _two_indexes({"name": "index_2_sparse", "sparse": True}),
     {"key": ID_A}, 72, ("Index key is partial.", "Index key is sparse."), "admin"),
]


XFAIL: dict[str, str] = {}


def _param(case: tuple) -> Any:
    marks = ([pytest.mark.xfail(strict=True, reason=XFAIL[case[0]])] if case[0] in XFAIL
             else [])
    return pytest.param(*case[1:], id=case[0], marks=marks)


@pytest.mark.parametrize(("setup", "fields", "code", "msgs", "db"), [_param(c) for c in CASES])
def test_simple_and_shard_key_validation(st, setup, fields, code, msgs, db):
    s = st.s
    setup(s, s[DB][COLL])
    command = {"refineCollectionShardKey": NS, **fields}
    if code is None:
        s[db].command(command)
        return
    _code(s, command, code, *msgs, db=db)


@pytest.mark.parametrize("check_epoch", [False, True], ids=["key", "new_epoch"])
def test_refined_key_in_config_collections(st, check_epoch):
    """`validateConfigCollections` after a useful index: the key (`key`), and a new
    `lastmodEpoch` (`new_epoch`)."""
    s = st.s
    coll = s[DB][COLL]
    _shard(s, {"_id": 1})
    coll.create_index({"_id": 1, "aKey": 1})
    old_epoch = _config_coll(s)["lastmodEpoch"]
    _refine(s, {"_id": 1, "aKey": 1})
    assert _config_coll(s)["key"] == {"_id": 1, "aKey": 1}
    if check_epoch:
        assert _config_coll(s)["lastmodEpoch"] != old_epoch


def test_dotted_fields(st):
    s = st.s
    coll = s[DB][COLL]
    for old, middle, new, new_middle in (
            ({"a": 1}, {"a": 0}, {"a": 1, "b.c": 1}, {"a": 0, "b.c": 0}),
            ({"a": 1, "b.c": 1}, {"a": 0, "b.c": 0},
             {"a": 1, "b.c": 1, "d": 1, "e.f.g": 1, "h": 1},
             {"a": 0, "b.c": 0, "d": 0, "e.f.g": 0, "h": 0}),
            ({"a.b": 1}, {"a.b": 0}, {"a.b": 1, "c": 1}, {"a.b": 0, "c": 0})):
        _shard(s, old)
        s.admin.command("split", NS, middle=middle)
        coll.create_index(list(new.items()))
        _refine(s, new)
        s.admin.command("split", NS, middle=new_middle)
        assert list(_config_coll(s)["key"].items()) == list(new.items())


def test_uniqueness(st):
    s = st.s
    coll = s[DB][COLL]
    _shard(s, {"_id": 1})
    coll.create_index({"_id": 1, "aKey": 1})
    _refine(s, {"_id": 1, "aKey": 1})
    assert _config_coll(s)["unique"] is False
    _shard(s, {"_id": 1}, unique=True)
    coll.create_index({"_id": 1, "aKey": 1})
    _refine(s, {"_id": 1, "aKey": 1})
    assert _config_coll(s)["unique"] is True
    s[DB].command({"drop": COLL})
    coll.create_index({"a": 1, "b": 1})
    s.admin.command({"shardCollection": NS, "key": {"a": 1}, "unique": True,
                     "enforceUniquenessCheck": False})
    _refine(s, {"a": 1, "b": 1}, enforceUniquenessCheck=False)
    assert _config_coll(s)["unique"] is True


def test_config_chunks_after_refine(st):
    s = st.s
    coll = s[DB][COLL]
    _shard(s, {"a": 1, "b": 1})
    coll.create_index({"a": 1, "b": 1, "c": 1, "d": 1})
    s.admin.command("split", NS, middle={"a": 0, "b": 0})
    s.admin.command("split", NS, middle={"a": 5, "b": 5})
    uuid = _config_coll(s)["uuid"]
    old_epoch = s.config.chunks.find_one({"uuid": uuid}).get("lastmodEpoch")
    _refine(s, {"a": 1, "b": 1, "c": 1, "d": 1})
    chunks = list(s.config.chunks.find({"uuid": uuid}, sort=[("min", 1)]))
    assert [(c["min"], c["max"]) for c in chunks] == [
        ({"a": MinKey(), "b": MinKey(), "c": MinKey(), "d": MinKey()},
         {"a": 0, "b": 0, "c": MinKey(), "d": MinKey()}),
        ({"a": 0, "b": 0, "c": MinKey(), "d": MinKey()},
         {"a": 5, "b": 5, "c": MinKey(), "d": MinKey()}),
        ({"a": 5, "b": 5, "c": MinKey(), "d": MinKey()},
         {"a": MaxKey(), "b": MaxKey(), "c": MaxKey(), "d": MaxKey()}),
    ]
    epochs = {c.get("lastmodEpoch") for c in chunks}
    assert len(epochs) == 1
    epoch = epochs.pop()
    assert (old_epoch is None and epoch is None) or old_epoch != epoch
