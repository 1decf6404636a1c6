"""updateDescription, legacy updateDescription and post-images from `$v:2` diffs.

Expectations come from (a) mongod's unit tests `change_stream_document_diff_parser_test.cpp`,
(b) the driver spec tests `change-streams-disambiguatedPaths.json` / array truncation,
(c) the jstest `jstests/change_streams/show_raw_update_description.js` (real diffs with the
post-images mongod returned), (d) real oplogs in the shared corpus, (e) the reader/applier rules of
`document_diff_serialization.cpp` / `document_diff_applier.cpp` (reference §1.2), and (f) a
Hypothesis model of "modify a document, write the diff mongod would write".

Outputs are compared through `bson.encode`, which pins field order and BSON types.
"""

from __future__ import annotations

import datetime
import glob
import json
from collections import OrderedDict
from typing import Any

import bson
import pytest
from bson import json_util
from bson.binary import Binary
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import OPLOG_CODEC_OPTIONS, iter_entries
from pipeline_stages.update_description import (
    apply_diff,
    legacy_update_description,
    update_description,
)


def raw(doc: dict[str, Any]) -> RawBSONDocument:
    """The document as the pipeline receives it from the oplog."""
    return RawBSONDocument(bson.encode(doc), OPLOG_CODEC_OPTIONS)


def enc(value: Any) -> bytes:
    """Order- and type-sensitive fingerprint of any value."""
    return bson.encode({"v": value})


def both(doc: dict[str, Any]) -> list[Any]:
    return [doc, raw(doc)]


def ud(diff: dict[str, Any], expanded: bool = True) -> list[dict[str, Any]]:
    """update_description for the diff as a dict and as RawBSONDocument (must agree)."""
    outs = [update_description(d, expanded) for d in both(diff)]
    assert enc(outs[0]) == enc(outs[1])
    return outs


def assert_ud(diff: dict[str, Any], expected: dict[str, Any], expanded: bool = True) -> None:
    for out in ud(diff, expanded):
        assert list(out) == list(expected)
        assert enc(out) == enc(expected), out


def assert_post(pre: dict[str, Any], diff: dict[str, Any], expected: dict[str, Any]) -> None:
    for p in both(pre):
        for d in both(diff):
            post = apply_diff(p, d)
            assert type(post) is dict
            assert enc(post) == enc(expected), post


def desc(
    updated: dict[str, Any] | None = None,
    removed: list[str] | None = None,
    truncated: list[dict[str, Any]] | None = None,
    disambiguated: dict[str, list[Any]] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "updatedFields": updated or {},
        "removedFields": removed or [],
        "truncatedArrays": truncated or [],
    }
    if disambiguated is not None:
        out["disambiguatedPaths"] = disambiguated
    return out


# --------------------------------------------------------------------------------------------
# updateDescription: mongod's parser unit tests (change_stream_document_diff_parser_test.cpp)
# --------------------------------------------------------------------------------------------


def test_disambiguates_dotted_fields() -> None:
    diff = {
        "u": {"a.b": 1},
        "sc.d.": {"u": {"e": 1, "f.g": 1}, "sh": {"u": {"i.j": 1}}},
        "sk": {"u": {"l.m": 1}},
    }
    assert_ud(
        diff,
        desc(
            {"a.b": 1, "c.d..e": 1, "c.d..f.g": 1, "c.d..h.i.j": 1, "k.l.m": 1},
            disambiguated={
                "a.b": ["a.b"],
                "c.d..e": ["c.d.", "e"],
                "c.d..f.g": ["c.d.", "f.g"],
                "c.d..h.i.j": ["c.d.", "h", "i.j"],
                "k.l.m": ["k", "l.m"],
            },
        ),
    )


def test_disambiguates_numeric_fields() -> None:
    assert_ud({"sa": {"u": {"0": 1}}}, desc({"a.0": 1}, disambiguated={"a.0": ["a", "0"]}))


def test_disambiguates_numeric_fields_from_array_indices() -> None:
    assert_ud(
        {"sa": {"s0": {"a": True, "u0": 1}}},
        desc({"a.0.0": 1}, disambiguated={"a.0.0": ["a", "0", 0]}),
    )


def test_numeric_field_at_root_is_not_ambiguous() -> None:
    assert_ud({"u": {"0": 1}}, desc({"0": 1}, disambiguated={}))


def test_numeric_field_with_leading_zero_is_not_ambiguous() -> None:
    assert_ud({"sa": {"u": {"01": 1}}}, desc({"a.01": 1}, disambiguated={}))


def test_array_indices_alone_are_not_ambiguous() -> None:
    assert_ud({"sa": {"a": True, "s0": {"u": {"b": 1}}}}, desc({"a.0.b": 1}, disambiguated={}))


def test_disambiguates_removed_fields() -> None:
    assert_ud(
        {"d": {"a.b": False}, "sc": {"d": {"0": False}}},
        desc(removed=["a.b", "c.0"], disambiguated={"a.b": ["a.b"], "c.0": ["c", "0"]}),
    )


def test_disambiguates_truncated_arrays() -> None:
    assert_ud(
        {"sa.b": {"a": True, "l": 5}, "sc": {"s0": {"a": True, "l": 5}}},
        desc(
            truncated=[{"field": "a.b", "newSize": 5}, {"field": "c.0", "newSize": 5}],
            disambiguated={"a.b": ["a.b"], "c.0": ["c", "0"]},
        ),
    )


def test_disambiguates_combination_of_ambiguous_fields() -> None:
    diff = {
        "sa.b": {"a": True, "s0": {"u": {"1": 1}}},
        "sc": {"a": True, "s0": {"u": {"d.e": 1}}, "s1": {"u": {"2": 1}}},
        "sf": {"s1": {"u": {"g.h": 1}, "s2": {"a": True, "u3": 1, "s4": {"u": {"5": 1}}}}},
    }
    assert_ud(
        diff,
        desc(
            {"a.b.0.1": 1, "c.0.d.e": 1, "c.1.2": 1, "f.1.g.h": 1, "f.1.2.3": 1, "f.1.2.4.5": 1},
            disambiguated={
                "a.b.0.1": ["a.b", 0, "1"],
                "c.0.d.e": ["c", 0, "d.e"],
                "c.1.2": ["c", 1, "2"],
                "f.1.g.h": ["f", "1", "g.h"],
                "f.1.2.3": ["f", "1", "2", 3],
                "f.1.2.4.5": ["f", "1", "2", 4, "5"],
            },
        ),
    )


def test_duplicate_paths_collapse_to_the_last_value() -> None:
    # mongod emits updatedFields {'a.b': 2, 'a.b': 1}; a dict keeps one key: the first position
    # with the last value, as a Python driver decodes mongod's reply (documented deviation).
    assert_ud(
        {"u": {"a.b": 2}, "sa": {"u": {"b": 1}}},
        desc({"a.b": 1}, disambiguated={"a.b": ["a.b"]}),
    )


# --------------------------------------------------------------------------------------------
# updateDescription: spec tests, key order, traversal order, pass-through
# --------------------------------------------------------------------------------------------


def test_spec_disambiguated_paths_present_when_ambiguous() -> None:
    # {_id: 1, a: {"1": 1}} + $set {"a.1": 2} is logged as {sa: {u: {"1": 2}}}.
    diff = {"sa": {"u": {"1": 2}}}
    assert_ud(diff, desc({"a.1": 2}, disambiguated={"a.1": ["a", "1"]}))
    assert_ud(diff, desc({"a.1": 2}), expanded=False)


def test_spec_disambiguated_paths_array_indices_are_int32() -> None:
    # {_id: 1, a: [{"1": 1}]} + $set {"a.0.1": 2}.
    for out in ud({"sa": {"a": True, "s0": {"u": {"1": 2}}}}):
        path = out["disambiguatedPaths"]["a.0.1"]
        assert path == ["a", 0, "1"] and type(path[1]) is int
        # Element "1" of the list is BSON int32 (type 0x10) 0, like mongod's std::stoi value.
        assert b"\x101\x00\x00\x00\x00\x00" in bson.encode(out["disambiguatedPaths"])


def test_spec_array_truncation() -> None:
    # [foo, {a: bar}, 1, 2, 3] replaced by [foo, {a: bar}] in a pipeline update.
    assert_ud(
        {"sarray": {"a": True, "l": 2}},
        desc(truncated=[{"field": "array", "newSize": 2}]),
        expanded=False,
    )


def test_disambiguated_paths_always_present_with_expanded_events() -> None:
    assert_ud({"u": {"x": 2}}, desc({"x": 2}, disambiguated={}))
    for out in ud({"u": {"x": 2}}, expanded=False):
        assert list(out) == ["updatedFields", "removedFields", "truncatedArrays"]


def test_traversal_order() -> None:
    diff = {
        "d": {"r1": False, "r2": False},
        "u": {"b": 1, "a": 2},
        "i": {"z": 3, "c": 4},
        "sy": {"d": {"gone": False}, "i": {"q": 5}},
        "sx": {"a": True, "l": 3, "u0": 6, "s1": {"u": {"k": 7}}, "u2": 8},
    }
    assert_ud(
        diff,
        desc(
            {"b": 1, "a": 2, "z": 3, "c": 4, "y.q": 5, "x.0": 6, "x.1.k": 7, "x.2": 8},
            removed=["r1", "r2", "y.gone"],
            truncated=[{"field": "x", "newSize": 3}],
            disambiguated={},
        ),
    )


def test_array_index_rendering_drops_leading_zeros() -> None:
    # The index is parsed as a number and printed back (FieldRef gets std::to_string(idx)).
    assert_ud({"sa": {"a": True, "u007": 1}}, desc({"a.7": 1}), expanded=False)


def test_ambiguity_is_inherited_by_the_rest_of_the_path() -> None:
    assert_ud(
        {"sa": {"s1": {"a": True, "l": 1, "u0": "v", "s1": {"d": {"k": False}}}}},
        desc(
            {"a.1.0": "v"},
            removed=["a.1.1.k"],
            truncated=[{"field": "a.1", "newSize": 1}],
            disambiguated={
                "a.1": ["a", "1"],
                "a.1.0": ["a", "1", 0],
                "a.1.1.k": ["a", "1", 1, "k"],
            },
        ),
    )


def test_unicode_digits_are_not_numeric() -> None:
    # ctype::isDigit is ASCII-only: "²" or "١" are plain names.
    assert_ud({"sa": {"u": {"²": 1, "١": 2}}}, desc({"a.²": 1, "a.١": 2}, disambiguated={}))


def test_values_pass_through_untouched() -> None:
    diff = raw({"u": {"doc": {"x": Binary(b"\x00\x01", 5)}, "arr": [{"y": 1}, 2]}})
    out = update_description(diff, False)["updatedFields"]
    assert type(out["doc"]) is RawBSONDocument
    assert out["doc"].raw == diff["u"]["doc"].raw
    assert type(out["arr"]) is list and type(out["arr"][0]) is RawBSONDocument


# --------------------------------------------------------------------------------------------
# Reader errors (document_diff_serialization.cpp), shared by both functions
# --------------------------------------------------------------------------------------------

READER_ERRORS = [
    ({}, 4770500, "Expected diff to be non-empty"),
    ({"sa": {}}, 4770500, "Expected diff to be non-empty"),
    ({"sa": {"a": True, "s0": {}}}, 4770500, "Expected diff to be non-empty"),
    ({"": {}}, 4770505, "Expected sections field names in diff to be non-empty "),
    ({"x": {}}, 4770503, "Unexpected section: x in document diff"),
    ({"a": True}, 4770503, "Unexpected section: a in document diff"),
    ({"u": {}, "d": {}}, 4770503, "Unexpected section: d in document diff"),
    ({"u": {}, "upd": {}}, 4770503, "Unexpected section: u in document diff"),
    ({"sa": {"u": {}}, "i": {}}, 4770514, "Did not expect more sections in diff but found one: i"),
    ({"u": 1}, 4770507, "Expected u section to be type object"),
    ({"d": [False]}, 4770507, "Expected d section to be type object"),
    ({"sa": 1}, 4770507, "Expected s section to be type object"),
    ({"sa": {"u": {}}, "sb": 5}, 470510, "Subdiffs should be objects, got sb: 5"),
    ({"sa": {"a": 1}}, 4770519, "Expected array header to be bool but got a: 1"),
    ({"sa": {"a": "x"}}, 4770519, 'Expected array header to be bool but got a: "x"'),
    ({"sa": {"a": False}}, 4770520, "Expected array header to be value true but got a: false"),
    ({"sa": {"a": True, "l": Int64(2)}}, 4770507, "Expected l section to be type int"),
    ({"sa": {"a": True, "l": 2.0}}, 4770507, "Expected l section to be type int"),
    (
        {"sa": {"a": True, "u": 1}},
        4770521,
        "expected field name to be at least two characters long, but found: u",
    ),
    (
        {"sa": {"a": True, "u0": 1, "l": 1}},  # 'l' only right after the header
        4770521,
        "expected field name to be at least two characters long, but found: l",
    ),
    ({"sa": {"a": True, "ux": 1}}, 4770512, "Expected integer but got x"),
    ({"sa": {"a": True, "u-1": 1}}, 4770512, "Expected integer but got -1"),
    ({"sa": {"a": True, "u+1": 1}}, 4770512, "Expected integer but got +1"),
    ({"sa": {"a": True, "u 1": 1}}, 4770512, "Expected integer but got  1"),
    ({"sa": {"a": True, "u4294967296": 1}}, 4770512, "Expected integer but got 4294967296"),
    ({"sa": {"a": True, "xy": 1}}, 4770512, "Expected integer but got y"),
    (
        {"sa": {"a": True, "x01": 1}},
        4770502,
        "Expected either 'u' (update) or 's' (sub diff) at index 1 but got x01: 1",
    ),
    ({"sa": {"a": True, "s3": 1}}, 4770501, "expected sub diff at index 3 but got s3: 1"),
    ({"sa": {"a": True, "s3": [1]}}, 4770501, "expected sub diff at index 3 but got s3: [ 1 ]"),
]


@pytest.mark.parametrize(("diff", "code", "message"), READER_ERRORS)
def test_reader_errors(diff: dict[str, Any], code: int, message: str) -> None:
    for d in both(diff):
        with pytest.raises(MongoError) as exc:
            update_description(d, True)
        assert (exc.value.code, exc.value.errmsg) == (code, message)


@pytest.mark.parametrize(("diff", "code", "message"), READER_ERRORS)
def test_reader_errors_from_the_applier(diff: dict[str, Any], code: int, message: str) -> None:
    # The applier reads array entries only when the field is an array in the pre-image: give
    # 'a' the type the sub-diff expects so that every check is reached.
    sub = diff.get("sa")
    is_array_diff = isinstance(sub, dict) and next(iter(sub), None) == "a"
    pre = {"_id": 1, "a": [{"k": 1}] if is_array_diff else {"k": 1}}
    for d in both(diff):
        with pytest.raises(MongoError) as exc:
            apply_diff(pre, d)
        assert (exc.value.code, exc.value.errmsg) == (code, message)


@pytest.mark.parametrize(
    ("value", "printed"),
    [
        (1, "1"),
        (1.0, "1.0"),
        (1.5, "1.5"),
        (1e20, "1e+20.0"),  # appendDoubleNice only checks for an upper-case 'E'
        (-0.1, "-0.1"),
        (Int64(5), "5"),
        (None, "null"),
        ({"b": 1, "c": "x"}, '{ b: 1, c: "x" }'),
        ({}, "{}"),
        ([], "[]"),
        ([1, [2]], "[ 1, [ 2 ] ]"),
        (ObjectId("0123456789abcdef01234567"), "ObjectId('0123456789abcdef01234567')"),
        (datetime.datetime(1970, 1, 1, 0, 0, 1), "new Date(1000)"),
        (b"\x01\xab", "BinData(0, 01AB)"),
        (
            Binary(bytes(range(16)), 4),
            'UUID("00010203-0405-0607-0809-0a0b0c0d0e0f")',
        ),
        ("*" * 200, '"' + "*" * 150 + '..."'),
    ],
)
def test_quoted_elements_print_like_bson_element(value: Any, printed: str) -> None:
    with pytest.raises(MongoError) as exc:
        update_description(raw({"sa": {"a": value}}), False)
    assert exc.value.errmsg == f"Expected array header to be bool but got a: {printed}"


def test_errors_follow_the_walk_order() -> None:
    # Sub-diffs are opened one at a time: the error inside 'sa' comes before the bad 'sb'.
    with pytest.raises(MongoError) as exc:
        update_description({"sa": {"x": {}}, "sb": 5}, False)
    assert exc.value.code == 4770503
    # Array entries are read one at a time: the bad nested diff at s0 comes before 'x1'.
    with pytest.raises(MongoError) as exc:
        update_description({"sa": {"a": True, "s0": {"q": {}}, "x1": 1}}, False)
    assert exc.value.code == 4770503


def test_applier_only_reads_what_it_reaches() -> None:
    # The applier opens a nested diff only when the pre-image holds a value of the right type,
    # so an invalid deeper diff under a missing field is never read (the parser does read it).
    diff = {"u": {"x": 1}, "sa": {"sb": {}}}
    assert apply_diff({"_id": 1}, diff) == {"_id": 1, "x": 1}
    with pytest.raises(MongoError) as exc:
        apply_diff({"_id": 1, "a": {"b": {}}}, diff)
    assert exc.value.code == 4770500
    with pytest.raises(MongoError):
        update_description(diff, False)


@pytest.mark.parametrize(
    ("diff", "name"),
    [
        ({"d": {"x": False}, "u": {"x": 1}}, "x"),
        ({"u": {"x": 1}, "i": {"x": 2}}, "x"),
        ({"d": {"x": False}, "i": {"x": 2}}, "x"),
        ({"u": {"x": 1}, "sx": {"u": {"y": 1}}}, "x"),
        ({"i": {"x": 1}, "sx": {"u": {"y": 1}}}, "x"),
        ({"sa": {"s0": {"u": {"k": 1}, "i": {"k": 2}}}}, "k"),
        # 7.0+ builds its table as d, u, s, then i: 'b' (i vs sb) is found before 'a' (i vs u).
        ({"u": {"a": 1}, "i": {"b": 1, "a": 1}, "sb": {"u": {"y": 1}}}, "b"),
    ],
)
def test_duplicate_field_in_diff(diff: dict[str, Any], name: str) -> None:
    pre = {"_id": 1, "a": {"0": {}}, "x": {"y": 0}, "b": {}}
    for d in both(diff):
        with pytest.raises(MongoError) as exc:
            apply_diff(pre, d)
        assert (exc.value.code, exc.value.errmsg) == (
            4728000,
            f"duplicate field name in diff: {name}",
        )


# --------------------------------------------------------------------------------------------
# apply_diff: one case per rule (document_diff_applier.cpp, reference §1.2 and §7)
# --------------------------------------------------------------------------------------------

PRE = {"_id": 1, "a": 1, "b": 2, "c": 3}


def test_update_keeps_position() -> None:
    assert_post(PRE, {"u": {"b": 9}}, {"_id": 1, "a": 1, "b": 9, "c": 3})


def test_delete_drops_field_and_ignores_absent_ones() -> None:
    assert_post(PRE, {"d": {"a": False, "zz": False}}, {"_id": 1, "b": 2, "c": 3})


def test_insert_appends() -> None:
    assert_post(PRE, {"i": {"z": 1, "y": 2}}, {"_id": 1, "a": 1, "b": 2, "c": 3, "z": 1, "y": 2})


def test_update_of_absent_field_appends_before_inserts() -> None:
    assert_post(
        PRE,
        {"u": {"a": 5, "x": 6}, "i": {"y": 7}},
        {"_id": 1, "a": 5, "b": 2, "c": 3, "x": 6, "y": 7},
    )


def test_insert_of_existing_field_moves_it_to_the_end() -> None:
    assert_post(PRE, {"u": {"a": 5}, "i": {"b": 8}}, {"_id": 1, "a": 5, "c": 3, "b": 8})


def test_insert_only_level_does_not_look_at_the_pre_image() -> None:
    # mongod (mustCheckExistenceForInsertOperations=false) appends a second 'b'; a dict keeps
    # the first position with the new value (documented deviation).
    assert_post(PRE, {"i": {"b": 8, "n": 0}}, {"_id": 1, "a": 1, "b": 8, "c": 3, "n": 0})


def test_subdiff_on_document() -> None:
    assert_post(
        {"_id": 1, "o": {"c": 1, "d": 1, "e": 1}, "z": 0},
        {"so": {"d": {"e": False}, "u": {"c": 2}, "i": {"f": 3}}},
        {"_id": 1, "o": {"c": 2, "d": 1, "f": 3}, "z": 0},
    )


@pytest.mark.parametrize(
    ("value", "diff"),
    [
        (5, {"u": {"c": 2}}),
        ([1], {"u": {"c": 2}}),
        ({"c": 1}, {"a": True, "u0": 1}),
        ("s", {"a": True, "u0": 1}),
        (None, {"a": True, "l": 0}),
    ],
)
def test_subdiff_on_wrong_type_gives_null(value: Any, diff: dict[str, Any]) -> None:
    assert_post({"_id": 1, "f": value, "z": 0}, {"sf": diff}, {"_id": 1, "f": None, "z": 0})


def test_subdiff_on_absent_field_does_nothing() -> None:
    assert_post(PRE, {"u": {"a": 0}, "sq": {"i": {"x": 1}}}, {"_id": 1, "a": 0, "b": 2, "c": 3})


@pytest.mark.parametrize(
    ("arr", "diff", "expected"),
    [
        ([1, 2, 3], {"a": True, "u1": 9}, [1, 9, 3]),
        ([1, 2, 3], {"a": True, "u3": 4}, [1, 2, 3, 4]),
        ([1, 2, 3], {"a": True, "u5": 6}, [1, 2, 3, None, None, 6]),
        ([1, 2, 3], {"a": True, "l": 1}, [1]),
        ([1, 2, 3], {"a": True, "l": 0}, []),
        ([1, 2, 3], {"a": True, "l": 2, "u1": "x"}, [1, "x"]),
        ([1, 2], {"a": True, "l": 4}, [1, 2, None, None]),
        ([1, 2], {"a": True, "l": 4, "u3": 7}, [1, 2, None, 7]),
        ([{"k": 1}, 2], {"a": True, "s0": {"u": {"k": 2}}}, [{"k": 2}, 2]),
        ([[1, 2], 3], {"a": True, "s0": {"a": True, "l": 1}}, [[1], 3]),
        ([1, 2], {"a": True, "s0": {"u": {"k": 2}}}, [None, 2]),
        ([{"k": 1}], {"a": True, "s0": {"a": True, "u0": 1}}, [None]),
        ([1], {"a": True, "s3": {"u": {"k": 2}}}, [1, None, None, None]),
        # Entries past 'l' (never written by mongod, whose applier then fails an invariant):
        # applied as read.
        ([1, 2, 3, 4], {"a": True, "l": 2, "u3": 9}, [1, 2, None, 9]),
        # Index written with leading zeros.
        ([1, 2], {"a": True, "u01": 5}, [1, 5]),
    ],
)
def test_array_rules(arr: list[Any], diff: dict[str, Any], expected: list[Any]) -> None:
    assert_post({"_id": 1, "arr": arr, "z": 0}, {"sarr": diff}, {"_id": 1, "arr": expected, "z": 0})


@pytest.mark.parametrize(
    "diff",
    [
        {"a": True, "u2": 1, "u1": 1},  # not ascending: mongod pads nulls until 64 MB
        {"a": True, "u1": 1, "s1": {"u": {"x": 1}}},  # the same index twice
        {"a": True, "u4": 1, "u01": 1},
        {"a": True, "u100000000": 1},  # more nulls than a 64 MB buffer holds
        {"a": True, "l": 100000000},
        {"a": True, "l": -1},  # compared unsigned by mongod: pads forever
    ],
)
def test_array_diffs_mongod_cannot_finish(diff: dict[str, Any]) -> None:
    with pytest.raises(MongoError) as exc:
        apply_diff({"_id": 1, "arr": [0, 0, 0]}, {"sarr": diff})
    assert exc.value.code == 13548
    assert exc.value.errmsg.endswith("bytes, past the 64MB limit.")


def test_large_but_possible_padding() -> None:
    post = apply_diff({"_id": 1, "arr": []}, {"sarr": {"a": True, "u100000": 1}})
    assert len(post["arr"]) == 100001 and post["arr"][-1] == 1 and post["arr"][99999] is None


def test_removed_id_is_kept_first() -> None:
    # ObjectReplaceExecutor keeps the pre-image's _id when the new document has none.
    assert_post({"a": 1, "_id": 2, "b": 3}, {"d": {"_id": False}}, {"_id": 2, "a": 1, "b": 3})
    assert_post({"a": 1}, {"d": {"a": False}}, {})


def test_unchanged_values_stay_raw() -> None:
    pre = raw({"_id": 1, "keep": {"x": [1, {"y": 2}]}, "mod": {"n": 1}})
    post = apply_diff(pre, raw({"smod": {"u": {"n": 2}}}))
    assert type(post["keep"]) is RawBSONDocument and post["keep"].raw == pre["keep"].raw
    assert type(post["mod"]) is dict
    assert enc(post) == enc({"_id": 1, "keep": {"x": [1, {"y": 2}]}, "mod": {"n": 2}})


def test_diff_values_stay_raw() -> None:
    diff = raw({"u": {"a": {"x": 1}}, "i": {"n": [{"y": 2}]}, "sb": {"a": True, "u1": {"z": 3}}})
    post = apply_diff(raw({"_id": 1, "a": 0, "b": [0]}), diff)
    assert type(post["a"]) is RawBSONDocument and post["a"].raw == diff["u"]["a"].raw
    assert type(post["n"][0]) is RawBSONDocument
    assert type(post["b"][1]) is RawBSONDocument


def test_ordered_mapping_inputs() -> None:
    pre = OrderedDict([("_id", 1), ("a", OrderedDict([("x", 1)]))])
    assert apply_diff(pre, OrderedDict([("sa", {"u": {"x": 2}})])) == {"_id": 1, "a": {"x": 2}}


# --------------------------------------------------------------------------------------------
# A real sequence: jstests/change_streams/show_raw_update_description.js (mongodb/mongo
# a8c248ee05c2b50c3d505c862d606bb1797a7f2f): each diff mongod logged and the post-image it
# returned with fullDocument: "updateLookup" (the jstest compares without field order; the
# orders below follow from the applier rules and match the jstest's listing).
# --------------------------------------------------------------------------------------------

GIANT = "*" * 1024
MEDIUM = "*" * 128
SMALL = "*" * 32

JSTEST_START = {
    "_id": 100,
    "a": 1,
    "b": 2,
    "arrayForSubdiff": [GIANT, {"a": MEDIUM}, 1, 2, 3],
    "arrayForReplacement": [0, 1, 2, 3],
    "giantStr": GIANT,
}

JSTEST_STEPS: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    (  # $set: {a: 2, arrayForSubdiff: [...], arrayForReplacement: [0], c: 3}
        {
            "u": {"a": 2, "arrayForReplacement": [0]},
            "i": {"c": 3},
            "sarrayForSubdiff": {"a": True, "l": 2, "s1": {"i": {"b": 3}}},
        },
        {
            "_id": 100,
            "a": 2,
            "b": 2,
            "arrayForSubdiff": [GIANT, {"a": MEDIUM, "b": 3}],
            "arrayForReplacement": [0],
            "giantStr": GIANT,
            "c": 3,
        },
        desc(
            {"a": 2, "arrayForReplacement": [0], "c": 3, "arrayForSubdiff.1.b": 3},
            truncated=[{"field": "arrayForSubdiff", "newSize": 2}],
        ),
    ),
    (  # $unset: ["a"]
        {"d": {"a": False}},
        {
            "_id": 100,
            "b": 2,
            "arrayForSubdiff": [GIANT, {"a": MEDIUM, "b": 3}],
            "arrayForReplacement": [0],
            "giantStr": GIANT,
            "c": 3,
        },
        desc(removed=["a"]),
    ),
    (  # $replaceRoot keeping only _id and giantStr
        {"d": {"c": False, "arrayForReplacement": False, "arrayForSubdiff": False, "b": False}},
        {"_id": 100, "giantStr": GIANT},
        desc(removed=["c", "arrayForReplacement", "arrayForSubdiff", "b"]),
    ),
    (  # $replaceRoot + $addFields + $project
        {
            "i": {
                "arr": [{"x": 1, "y": SMALL}, MEDIUM],
                "arr_a": [1, MEDIUM],
                "arr_b": [[1, SMALL], MEDIUM],
                "arr_c": [[SMALL, 1, 2, 3], MEDIUM],
                "obj": {"x": {"a": 1, "b": 1, "c": [MEDIUM, 1, 2, 3], "str": MEDIUM}},
                "a": "updated",
                "doc": {"a": {"0": "foo"}},
            }
        },
        {
            "_id": 100,
            "giantStr": GIANT,
            "arr": [{"x": 1, "y": SMALL}, MEDIUM],
            "arr_a": [1, MEDIUM],
            "arr_b": [[1, SMALL], MEDIUM],
            "arr_c": [[SMALL, 1, 2, 3], MEDIUM],
            "obj": {"x": {"a": 1, "b": 1, "c": [MEDIUM, 1, 2, 3], "str": MEDIUM}},
            "a": "updated",
            "doc": {"a": {"0": "foo"}},
        },
        desc(
            {
                "arr": [{"x": 1, "y": SMALL}, MEDIUM],
                "arr_a": [1, MEDIUM],
                "arr_b": [[1, SMALL], MEDIUM],
                "arr_c": [[SMALL, 1, 2, 3], MEDIUM],
                "obj": {"x": {"a": 1, "b": 1, "c": [MEDIUM, 1, 2, 3], "str": MEDIUM}},
                "a": "updated",
                "doc": {"a": {"0": "foo"}},
            }
        ),
    ),
    (  # modifications to nested elements
        {
            "d": {"a": False, "doc": False},
            "sarr": {"a": True, "s0": {"d": {"x": False}}},
            "sarr_a": {"a": True, "u0": 2},
            "sarr_b": {"a": True, "s0": {"a": True, "u0": 2}},
            "sarr_c": {"a": True, "s0": {"a": True, "l": 1}},
            "sobj": {"sx": {"d": {"a": False}, "u": {"b": 2}, "sc": {"a": True, "l": 1}}},
        },
        {
            "_id": 100,
            "giantStr": GIANT,
            "arr": [{"y": SMALL}, MEDIUM],
            "arr_a": [2, MEDIUM],
            "arr_b": [[2, SMALL], MEDIUM],
            "arr_c": [[SMALL], MEDIUM],
            "obj": {"x": {"b": 2, "c": [MEDIUM], "str": MEDIUM}},
        },
        desc(
            {"arr_a.0": 2, "arr_b.0.0": 2, "obj.x.b": 2},
            removed=["a", "doc", "arr.0.x", "obj.x.a"],
            truncated=[{"field": "arr_c.0", "newSize": 1}, {"field": "obj.x.c", "newSize": 1}],
        ),
    ),
]


def test_jstest_sequence() -> None:
    doc: Any = raw(JSTEST_START)
    for diff, post, description in JSTEST_STEPS:
        assert_ud(diff, description, expanded=False)
        assert_post(bson.decode(bson.encode(doc)), diff, post)
        doc = raw(apply_diff(doc, raw(diff)))
        assert enc(doc) == enc(post)


def test_corpus_expected_events_agree(shared_dir) -> None:
    """The same jstest as recorded in corpus/expected_events.json (raw-pipeline-* items)."""
    items = {
        it["id"]: it
        for it in json.loads((shared_dir / "corpus/expected_events.json").read_text())["items"]
    }
    ids = ["raw-pipeline-set", "raw-pipeline-unset", "raw-pipeline-replaceRoot"]
    for item_id, (diff, post, _) in zip(ids, JSTEST_STEPS):
        event = json_util.loads(json.dumps(items[item_id]["expected_events"][0]))
        assert enc(event["rawUpdateDescription"]["diff"]) == enc(diff)
        assert event["fullDocument"] == post
    nested = json_util.loads(json.dumps(items["raw-pipeline-nested"]["expected_events"][0]))
    assert enc(nested["rawUpdateDescription"]["diff"]) == enc(JSTEST_STEPS[-1][0])
    assert nested["fullDocument"] == JSTEST_STEPS[-1][1]


# --------------------------------------------------------------------------------------------
# Legacy $v:1 updates (6.x change_stream_event_transform.cpp)
# --------------------------------------------------------------------------------------------


def test_legacy_mongoshake_entry() -> None:
    # Real 4.4 entry quoted in corpus/oplog/extracted/mongoshake_oplog_entries.json.
    o = {"$v": 1, "$set": {"b": 3}, "$unset": {"c": True}}
    for x in both(o):
        out = legacy_update_description(x)
        assert list(out) == ["updatedFields", "removedFields"]  # no truncatedArrays in <= 6.x
        assert enc(out) == enc({"updatedFields": {"b": 3}, "removedFields": ["c"]})


@pytest.mark.parametrize(
    ("o", "expected"),
    [
        (
            {"$set": {"a.b": 1, "c": [1]}},
            {"updatedFields": {"a.b": 1, "c": [1]}, "removedFields": []},
        ),
        (
            {"$v": 1, "$unset": {"x": 1, "y.z": ""}},
            {"updatedFields": {}, "removedFields": ["x", "y.z"]},
        ),
        ({"$v": 1, "$unset": 5}, {"updatedFields": {}, "removedFields": []}),
        ({"$v": 1, "$set": None}, {"updatedFields": None, "removedFields": []}),
    ],
)
def test_legacy_shapes(o: dict[str, Any], expected: dict[str, Any]) -> None:
    for x in both(o):
        assert enc(legacy_update_description(x)) == enc(expected)


def test_legacy_set_passes_through_raw() -> None:
    o = raw({"$v": 1, "$set": {"a": {"b": 1}}})
    assert legacy_update_description(o)["updatedFields"] is o["$set"]


# --------------------------------------------------------------------------------------------
# Real $v:2 diffs recorded by mongod (corpus: mongo-tools timeseries oplog, 5.0)
# --------------------------------------------------------------------------------------------


def _v2_updates(shared_dir) -> list[Any]:
    root = shared_dir / "corpus/oplog/mongodb-mongo-tools"
    out = []
    for path in sorted(glob.glob(str(root / "**/*.bson"), recursive=True)):
        with open(path, "rb") as f:
            for entry in iter_entries(f.read()):
                if entry.get("op") == "u" and entry["o"].get("$v") == 2:
                    out.append(entry)
    return out


def _leaves(diff: Any, array: bool = False) -> tuple[int, int, int]:
    """(updated, removed, truncated) entry counts of a diff, walking it independently."""
    u = r = t = 0
    for key, value in diff.items():
        if array:
            if key == "a":
                continue
            if key == "l":
                t += 1
            elif key[0] == "u":
                u += 1
            else:
                sub = _leaves(value, next(iter(value)) == "a")
                u, r, t = u + sub[0], r + sub[1], t + sub[2]
        elif key in ("u", "i"):
            u += len(value)
        elif key == "d":
            r += len(value)
        else:
            sub = _leaves(value, next(iter(value)) == "a")
            u, r, t = u + sub[0], r + sub[1], t + sub[2]
    return u, r, t


def test_corpus_v2_updates(shared_dir) -> None:
    entries = _v2_updates(shared_dir)
    assert len(entries) >= 800
    for entry in entries:
        diff = entry["o"]["diff"]
        out = update_description(diff, True)
        plain = update_description(entry["o"]["diff"], False)
        assert list(out) == [
            "updatedFields",
            "removedFields",
            "truncatedArrays",
            "disambiguatedPaths",
        ]
        assert enc({k: v for k, v in out.items() if k != "disambiguatedPaths"}) == enc(plain)
        # Same result from the fully decoded (plain dict) diff.
        assert enc(update_description(bson.decode(diff.raw), True)) == enc(out)
        counts = tuple(len(out[k]) for k in ("updatedFields", "removedFields", "truncatedArrays"))
        assert counts == _leaves(diff)
        paths = [*out["updatedFields"], *out["removedFields"]]
        paths += [t["field"] for t in out["truncatedArrays"]]
        for path in paths:
            parts = path.split(".")
            # Buckets: data.<field>.<index> names are numeric strings below the root -> ambiguous.
            ambiguous = any(p.isdigit() for p in parts[1:])
            assert (path in out["disambiguatedPaths"]) == ambiguous
            if ambiguous:
                assert out["disambiguatedPaths"][path] == parts


def test_corpus_first_bucket_update(shared_dir) -> None:
    entry = _v2_updates(shared_dir)[0]
    oid = ObjectId("60c7df3b15caf5ee94e01f7e")
    ts = datetime.datetime(2021, 6, 14, 22, 59, 7, 966000)
    # diff: {scontrol: {smax: {u: {_id: oid, ts: ts}}},
    #        sdata: {sts: {i: {"129": ts}}, smeasurement: {i: {"129": 292}},
    #                s_id: {i: {"129": oid}}}}
    expected = desc(
        {
            "control.max._id": oid,
            "control.max.ts": ts,
            "data.ts.129": ts,
            "data.measurement.129": 292,
            "data._id.129": oid,
        },
        disambiguated={
            "data.ts.129": ["data", "ts", "129"],
            "data.measurement.129": ["data", "measurement", "129"],
            "data._id.129": ["data", "_id", "129"],
        },
    )
    assert enc(update_description(entry["o"]["diff"], True)) == enc(expected)


def test_corpus_bucket_chains(shared_dir) -> None:
    """Replay each bucket's diffs from an empty bucket: inserts always add new indexes, in order,
    and every updatedFields value is found at its path in the post-image."""
    buckets: dict[Any, Any] = {}
    inserted: dict[Any, list[str]] = {}
    for entry in _v2_updates(shared_dir):
        key = entry["o2"]["_id"]
        doc = buckets.get(key) or {
            "_id": key,
            "control": {"version": 1, "min": {}, "max": {}},
            "data": {"_id": {}, "measurement": {}, "ts": {}},
        }
        diff = entry["o"]["diff"]
        new_index = next(iter(diff["sdata"]["sts"]["i"]))
        assert new_index not in doc["data"]["ts"]
        post = apply_diff(doc, diff)
        assert list(post) == ["_id", "control", "data"]
        description = update_description(diff, True)
        for path, value in description["updatedFields"].items():
            node = post
            for part in description["disambiguatedPaths"].get(path, path.split(".")):
                node = node[part]
            assert node == value
        buckets[key] = post
        inserted.setdefault(key, []).append(new_index)
    assert len(buckets) > 1
    for key, doc in buckets.items():
        for field in ("_id", "measurement", "ts"):
            assert list(doc["data"][field]) == inserted[key]


# --------------------------------------------------------------------------------------------
# Property: modify a random document, write the diff mongod would write, check both functions
# --------------------------------------------------------------------------------------------

NAMES = ["a", "b", "c", "0", "1", "12", "01", "d.e", "f"]
names = st.sampled_from(NAMES)
scalars = st.one_of(
    st.integers(-3, 3), st.text("xyz", max_size=2), st.none(), st.booleans(), st.floats(0, 1)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(names, inner, max_size=4)),
    max_leaves=12,
)


class Model:
    """What changed, in the order mongod's parser walks the diff."""

    def __init__(self) -> None:
        self.updated: list[tuple[tuple[Any, ...], Any]] = []
        self.removed: list[tuple[Any, ...]] = []
        self.truncated: list[tuple[tuple[Any, ...], int]] = []
        self.emitted: list[tuple[Any, ...]] = []  # every path, in walk order

    def set(self, path: tuple[Any, ...], value: Any) -> None:
        self.updated.append((path, value))
        self.emitted.append(path)

    def unset(self, path: tuple[Any, ...]) -> None:
        self.removed.append(path)
        self.emitted.append(path)

    def truncate(self, path: tuple[Any, ...], size: int) -> None:
        self.truncated.append((path, size))
        self.emitted.append(path)

    def extend(self, other: Model) -> None:
        self.updated += other.updated
        self.removed += other.removed
        self.truncated += other.truncated
        self.emitted += other.emitted


def _doc_change(
    draw: Any, pre: dict[str, Any], path: tuple[Any, ...]
) -> tuple[dict[str, Any] | None, dict[str, Any], Model]:
    deletes: dict[str, bool] = {}
    updates: dict[str, Any] = {}
    subdiffs: dict[str, Any] = {}
    children: list[Model] = []
    post: dict[str, Any] = {}
    for name, value in pre.items():
        ops = ["keep", "delete", "update"]
        if isinstance(value, (dict, list)) and value:
            ops.append("sub")
        op = "keep" if name == "_id" else draw(st.sampled_from(ops))
        if op == "keep":
            post[name] = value
        elif op == "delete":
            deletes[name] = False
        elif op == "update":
            post[name] = updates[name] = draw(values)
        else:
            change = _doc_change if isinstance(value, dict) else _array_change
            sub, sub_post, model = change(draw, value, (*path, name))
            post[name] = sub_post
            if sub is not None:
                subdiffs["s" + name] = sub
                children.append(model)
    inserts = {}
    for name in draw(st.lists(names, max_size=3, unique=True)):
        if name not in pre:
            post[name] = inserts[name] = draw(values)
    model = Model()
    for n, v in (*updates.items(), *inserts.items()):
        model.set((*path, n), v)
    for n in deletes:
        model.unset((*path, n))
    for child in children:
        model.extend(child)
    diff: dict[str, Any] = {}
    for key, section in (("d", deletes), ("u", updates), ("i", inserts)):
        if section:
            diff[key] = section
    diff.update(subdiffs)
    return (diff or None), post, model


def _array_change(
    draw: Any, pre: list[Any], path: tuple[Any, ...]
) -> tuple[dict[str, Any] | None, list[Any], Model]:
    n = len(pre)
    new_len = draw(st.integers(0, n + 2))
    diff: dict[str, Any] = {"a": True}
    model = Model()
    if new_len < n:
        diff["l"] = new_len
        model.truncate(path, new_len)
    post: list[Any] = []
    for i in range(new_len):
        if i >= n:  # growth is written as u<index> entries
            diff[f"u{i}"] = new = draw(values)
            post.append(new)
            model.set((*path, i), new)
            continue
        value = pre[i]
        ops = ["keep", "update"]
        if isinstance(value, (dict, list)) and value:
            ops.append("sub")
        op = draw(st.sampled_from(ops))
        if op == "keep":
            post.append(value)
        elif op == "update":
            diff[f"u{i}"] = new = draw(values)
            post.append(new)
            model.set((*path, i), new)
        else:
            change = _doc_change if isinstance(value, dict) else _array_change
            sub, sub_post, sub_model = change(draw, value, (*path, i))
            post.append(sub_post)
            if sub is not None:
                diff[f"s{i}"] = sub
                model.extend(sub_model)
    return (diff if len(diff) > 1 else None), post, model


@st.composite
def modifications(draw: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], Model]:
    pre = {"_id": 1, **draw(st.dictionaries(names, values, max_size=6))}
    diff, post, model = _doc_change(draw, pre, ())
    if diff is None:  # mongod logs no entry for a no-op update; make it a real one
        diff = {"i": {"new": 0}}
        post["new"] = 0
        model.set(("new",), 0)
    return pre, diff, post, model


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _ambiguous(path: tuple[Any, ...]) -> bool:
    """The rule stated per path (the implementation tracks it incrementally)."""
    for pos, part in enumerate(path):
        if isinstance(part, int):
            continue
        if "." in part:
            return True
        if pos > 0 and part.isdigit() and (part == "0" or not part.startswith("0")):
            return True
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modifications())
def test_property_apply_and_describe(case: tuple[Any, ...]) -> None:
    pre, diff, post, model = case
    expected = desc(
        {_dotted(p): v for p, v in model.updated},
        [_dotted(p) for p in model.removed],
        [{"field": _dotted(p), "newSize": n} for p, n in model.truncated],
        {_dotted(p): list(p) for p in model.emitted if _ambiguous(p)},
    )
    for p in both(pre):
        for d in both(diff):
            assert enc(apply_diff(p, d)) == enc(post)
            out = update_description(d, True)
            assert enc(out) == enc(expected)
            if isinstance(d, RawBSONDocument):  # document values are handed on undecoded
                assert not any(_holds_dict(v) for v in out["updatedFields"].values())


def _holds_dict(value: Any) -> bool:
    if isinstance(value, list):
        return any(_holds_dict(v) for v in value)
    return isinstance(value, dict)
