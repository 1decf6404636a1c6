"""A proposed shard key against the collection's indexes and documents, as shardCollection
and refineCollectionShardKey check it (mongod's `shard_key_util.cpp`
`validShardKeyIndexExists` / `validateShardKeyIndexExistsOrCreateIfPossible` and
`shard_key_index_util.cpp` `isCompatibleWithShardKey`): the key pattern itself, the unique
indexes it must be a prefix of, and the index that supports it (the key a prefix of its key;
not sparse, not partial, not multikey on the key's fields, the simple collation)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import document_string

InvalidOptions = 72  # error code
PLEASE_CREATE = ("Please create an index that starts with the proposed shard key before "
                 "sharding the collection. ")


def check_key_pattern(key: Any, two_hashed_code: int = 31303) -> dict[str, Any]:
    """ShardKeyPattern's checks: a non-empty pattern of 1 / 'hashed' values, one hashed field
    at most (shardCollection: 31303; refineCollectionShardKey: 2 BadValue)."""
    if not isinstance(key, Mapping) or not key:
        raise MongoError(2, "Shard key cannot be empty")
    hashed = 0
    for value in key.values():
        if value == "hashed":
            hashed += 1
        elif value != 1 or isinstance(value, bool):
            raise MongoError(
                2, f"Shard key {dict(key)} must be a pattern with values 1 or 'hashed'"
            )
    if hashed > 1:
        raise MongoError(two_hashed_code,
                         "A shard key pattern cannot contain more than 1 hashed field")
    return dict(key)


def simple_collation(collation: Any) -> bool:
    return collation is None or (isinstance(collation, Mapping)
                                 and collation.get("locale") == "simple")


def _is_prefix(key: Mapping[str, Any], index_key: Mapping[str, Any]) -> bool:
    """BSONObj::isPrefixOf: the key's fields, in order, start the index's, with equal
    values."""
    fields = list(index_key.items())
    if len(fields) < len(key):
        return False
    for (field, kind), (ifield, ikind) in zip(key.items(), fields, strict=False):
        if field != ifield or kind != ikind or isinstance(kind, bool) != isinstance(ikind, bool):
            return False
    return True


def _has_array(doc: Any, path: str) -> bool:
    """Whether an array lies along `path` in `doc` (the index is multikey on it)."""
    value = doc
    for part in path.split("."):
        if isinstance(value, list):
            return True
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return isinstance(value, list)


def _multikey(docs: Iterable[Mapping[str, Any]], key: Mapping[str, Any]) -> bool:
    return any(_has_array(d, f) for d in docs for f in key)


def _reasons(spec: Mapping[str, Any], multikey: bool) -> list[str]:
    reasons = []
    if "partialFilterExpression" in spec:
        reasons.append("Index key is partial.")
    if spec.get("sparse"):
        reasons.append("Index key is sparse.")
    if multikey:
        reasons.append("Index key is multikey.")
    if not simple_collation(spec.get("collation")):
        reasons.append("Index has a non-simple collation.")
    return reasons


def useful_index(ns: str, key: Mapping[str, Any], indexes: Sequence[Mapping[str, Any]],
                 docs: Sequence[Mapping[str, Any]], unique: bool,
                 check_unique_indexes: bool = True) -> tuple[bool, str]:
    """(whether an index supports `key`, why none does): refuses a unique index the key is
    not a prefix of (`check_unique_indexes`: shardCollection; a refined key only adds fields
    to one whose uniqueness holds), and a key to be unique whose exact index is not."""
    for spec in indexes if check_unique_indexes else []:
        fields = list(spec["key"])
        compatible = fields[:1] == ["_id"] or fields[: len(key)] == list(key)
        if (spec.get("unique") or spec.get("prepareUnique")) and not compatible:
            raise MongoError(
                InvalidOptions,
                f"can't shard collection '{ns}' with unique index on "
                f"{document_string(spec['key'])} and proposed shard key "
                f"{document_string(key)}. Uniqueness can't be maintained unless shard key is "
                "a prefix")
    found = False
    why: list[str] = []
    multikey = _multikey(docs, key)
    for spec in indexes:
        if not _is_prefix(key, spec["key"]):
            continue
        reasons = _reasons(spec, multikey)
        if reasons:
            why.append(f"Index {spec['name']} cannot be used for sharding because: "
                       + " ".join(reasons))
        else:
            found = True
    if found and unique:
        exact = next((s for s in indexes if list(s["key"].items()) == list(key.items())), None)
        if exact is None:
            return False, " ".join(why)
        if not exact.get("unique") and next(iter(exact["key"])) != "_id":
            raise MongoError(InvalidOptions,
                             f"can't shard collection {ns}, {document_string(key)} index not "
                             "unique, and unique index explicitly specified")
    return found, " ".join(why)
