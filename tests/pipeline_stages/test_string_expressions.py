"""String expressions (pipeline_stages/string_expressions.py) through a real client against the
embedded store, with mongod 8.0's results and errors (evaluate_string.cpp, str_trim_utils.cpp,
substr_utils.cpp): byte semantics, ASCII-only case mapping, null / missing handling."""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp
from pymongo import errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

NOT_UTF8 = b"a\xc3\xa9\xffb"  # "aé", a lone 0xFF, "b"
RAW: CodecOptions[dict[str, Any]] = CodecOptions(unicode_decode_error_handler="surrogateescape")


def _raw_document(_id: int, data: bytes) -> RawBSONDocument:
    body = (b"\x10_id\x00" + struct.pack("<i", _id) + b"\x02s\x00"
            + struct.pack("<i", len(data) + 1) + data + b"\x00")
    return RawBSONDocument(struct.pack("<i", len(body) + 5) + body + b"\x00")


@pytest.fixture(scope="module")
def coll() -> Iterator[Collection[Any]]:
    with EmbeddedServer() as server:
        collection = server.client().get_database("strings", codec_options=RAW).c
        collection.insert_many([{"_id": 1, "s": "café", "n": None, "i": 3}])
        collection.insert_one(_raw_document(2, NOT_UTF8))
        yield collection


def _one(coll: Collection[Any], expr: object, _id: int = 1) -> object:
    (doc,) = coll.aggregate([{"$match": {"_id": _id}}, {"$project": {"_id": 0, "v": expr}}])
    return doc.get("v", "<missing>")


def _error(coll: Collection[Any], expr: object, _id: int = 1) -> tuple[int | None, str]:
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, expr, _id)
    return exc.value.code, exc.value.details["errmsg"]  # type: ignore[index]


def test_lengths_count_bytes_and_lead_bytes(coll: Collection[Any]) -> None:
    assert _one(coll, {"$strLenBytes": "$s"}) == 5
    assert _one(coll, {"$strLenCP": "$s"}) == 4
    assert _one(coll, {"$strLenBytes": ["$s"]}) == 5
    assert _one(coll, {"$strLenBytes": "$s"}, 2) == 5
    assert _one(coll, {"$strLenCP": "$s"}, 2) == 4  # the lone 0xFF is not a continuation byte
    assert _error(coll, {"$strLenCP": "$nope"}) == (
        34471, "$strLenCP requires a string argument, found: missing")
    assert _error(coll, {"$strLenBytes": "$n"}) == (
        34473, "$strLenBytes requires a string argument, found: null")
    assert _error(coll, {"$strLenBytes": ["a", "b"]}) == (
        16020, "Expression $strLenBytes takes exactly 1 arguments. 2 were passed in.")


def test_substr_bytes_refuses_to_cut_a_character(coll: Collection[Any]) -> None:
    assert _one(coll, {"$substrBytes": ["$s", 0, 3]}) == "caf"
    assert _one(coll, {"$substrBytes": ["$s", 3, -1]}) == "é"
    assert _one(coll, {"$substr": ["$s", 1, Int64(2)]}) == "af"
    assert _one(coll, {"$substrBytes": ["$s", 9, 2]}) == ""
    assert _one(coll, {"$substrBytes": ["$n", 0, 2]}) == ""
    assert _one(coll, {"$substrBytes": [12345, 1, 2.9]}) == "23"
    assert _error(coll, {"$substr": ["$s", 0, 4]}) == (
        28657, "$substrBytes:  Invalid range, ending index is in the middle of a UTF-8 "
        "character.")
    assert _error(coll, {"$substrBytes": ["$s", 4, 1]}) == (
        28656, "$substrBytes:  Invalid range, starting index is a UTF-8 continuation byte.")
    assert _error(coll, {"$substrBytes": ["$s", -1, 1]}) == (
        50752, "$substrBytes:  starting index must be non-negative (got: -1)")
    assert _error(coll, {"$substrBytes": ["$s", "0", 1]}) == (
        16034, "$substrBytes:  starting index must be a numeric type (is BSON type string)")
    assert _error(coll, {"$substrBytes": ["$s", 0, "$nope"]}) == (
        16035, "$substrBytes:  length must be a numeric type (is BSON type missing)")
    assert _error(coll, {"$substr": ["$s", 0]}) == (
        16020, "Expression $substrBytes takes exactly 3 arguments. 2 were passed in.")
    assert _error(coll, {"$substrBytes": [True, 0, 1]}) == (
        16007, "can't convert from BSON type bool to String")


def test_substr_cp(coll: Collection[Any]) -> None:
    assert _one(coll, {"$substrCP": ["$s", 1, 3]}) == "afé"
    assert _one(coll, {"$substrCP": ["$s", 3, 10]}) == "é"
    assert _one(coll, {"$substrCP": ["$s", 9, 1]}) == ""
    assert _one(coll, {"$substrCP": ["$s", 0, 2]}, 2) == "aé"
    # 0xFF reads as the lead byte of an 8-byte code point (its leading one bits): refused
    invalid = "$substrCP: invalid UTF-8 string"
    assert _error(coll, {"$substrCP": ["$s", 1, 2]}, 2) == (34459, invalid)
    assert _error(coll, {"$substrCP": ["$s", 3, 1]}, 2) == (34457, invalid)
    assert _error(coll, {"$substrCP": ["$s", 1.5, 1]}) == (
        34451, "$substrCP: starting index cannot be represented as a 32-bit integral value: "
        "1.5")
    assert _error(coll, {"$substrCP": ["$s", 0, -1]}) == (
        34454, "$substrCP: length must be a nonnegative integer.")
    assert _error(coll, {"$substrCP": ["$s", -1, 1]}) == (
        34455, "$substrCP: the starting index must be nonnegative integer.")
    assert _error(coll, {"$substrCP": ["$s", None, 1]}) == (
        34450, "$substrCP: starting index must be a numeric type (is BSON type null)")


def test_trim(coll: Collection[Any]) -> None:
    assert _one(coll, {"$trim": {"input": "\u2000 \t a b\n\u00a0"}}) == "a b"
    assert _one(coll, {"$trim": {"input": "\u200ba\u200b"}}) == "\u200ba\u200b"
    assert _one(coll, {"$ltrim": {"input": "xyxa x", "chars": "yx"}}) == "a x"
    assert _one(coll, {"$rtrim": {"input": "éaéé", "chars": "é"}}) == "éa"
    assert _one(coll, {"$trim": {"input": "$nope"}}) is None
    assert _one(coll, {"$trim": {"input": "a", "chars": "$n"}}) is None
    assert _error(coll, {"$trim": {"input": 5}}) == (
        50699, "$trim requires its input to be a string, got 5 (of type int) instead.")
    assert _error(coll, {"$trim": {"input": datetime.datetime(2024, 1, 2)}}) == (
        50699, "$trim requires its input to be a string, got 2024-01-02T00:00:00.000Z (of type "
        "date) instead.")  # Value's stream prints a date as its ISO string
    assert _error(coll, {"$trim": {"input": [ObjectId("5ab9cbe531c2ab715d42129e"), "a"]}}) == (
        50699, '$trim requires its input to be a string, got [5ab9cbe531c2ab715d42129e, "a"] '
        "(of type array) instead.")
    assert _error(coll, {"$ltrim": {"input": "a", "chars": 1.5}}) == (
        50700, "$ltrim requires 'chars' to be a string, got 1.5 (of type double) instead.")
    assert _error(coll, {"$rtrim": "a"}) == (
        50696, "$rtrim only supports an object as an argument, found string")
    assert _error(coll, {"$trim": {"input": "a", "x": 1}}) == (
        50694, "$trim found an unknown argument: x")
    assert _error(coll, {"$trim": {"chars": "a"}}) == (50695, "$trim requires an 'input' field")


def test_replace(coll: Collection[Any]) -> None:
    args = {"input": "abab", "find": "ab", "replacement": "x"}
    assert _one(coll, {"$replaceOne": args}) == "xab"
    assert _one(coll, {"$replaceAll": args}) == "xx"
    assert _one(coll, {"$replaceAll": {"input": "ab", "find": "", "replacement": "-"}}) == "-a-b-"
    assert _one(coll, {"$replaceOne": {"input": "ab", "find": "", "replacement": "-"}}) == "-ab"
    assert _one(coll, {"$replaceOne": {"input": "$nope", "find": "a", "replacement": "b"}}) is None
    assert _error(coll, {"$replaceAll": {"input": "$nope", "find": "a", "replacement": 1}}) == (
        51744, "$replaceAll requires that 'replacement' be a string, found: 1")
    assert _error(coll, {"$replaceOne": {"input": 2.5, "find": "a", "replacement": "b"}}) == (
        51746, "$replaceOne requires that 'input' be a string, found: 2.5")
    assert _error(coll, {"$replaceAll": {"input": "a", "find": ["a"], "replacement": "b"}}) == (
        51745, "$replaceAll requires that 'find' be a string, found: [\"a\"]")
    assert _error(coll, {"$replaceOne": {"input": "a", "find": "a"}}) == (
        51747, "$replaceOne requires 'replacement' to be specified")
    assert _error(coll, {"$replaceOne": ["a"]}) == (
        51751, "$replaceOne requires an object as an argument, found: array")
    assert _error(coll, {"$replaceAll": {"input": "a", "with": "a"}}) == (
        51750, "$replaceAll found an unknown argument: with")


def test_split(coll: Collection[Any]) -> None:
    assert _one(coll, {"$split": ["a,b,", ","]}) == ["a", "b", ""]
    assert _one(coll, {"$split": ["$s", "é"]}) == ["caf", ""]
    assert _one(coll, {"$split": ["$s", "é"]}, 2) == ["a", "\udcffb"]
    assert _one(coll, {"$split": ["$nope", ","]}) is None
    assert _one(coll, {"$split": [1, None]}) is None
    assert _error(coll, {"$split": [1, ","]}) == (
        40085, "$split requires an expression that evaluates to a string as a first argument, "
        "found: int")
    assert _error(coll, {"$split": ["a", 1]}) == (
        40086, "$split requires an expression that evaluates to a string as a second argument, "
        "found: int")
    assert _error(coll, {"$split": ["a", ""]}) == (40087, "$split requires a non-empty separator")
    assert _error(coll, {"$split": "a"}) == (
        16020, "Expression $split takes exactly 2 arguments. 1 were passed in.")


def test_case_mapping_is_ascii_only(coll: Collection[Any]) -> None:
    assert _one(coll, {"$toUpper": "$s"}) == "CAFé"
    assert _one(coll, {"$toLower": "ÉCOLE"}) == "École"
    assert _one(coll, {"$toUpper": "$nope"}) == ""
    assert _one(coll, {"$toUpper": 1.23456789}) == "1.23457"
    assert _one(coll, {"$toLower": Timestamp(86_400 * 31 + 3661, 7)}) == "feb  1 01:01:01:7"
    assert _one(coll, {"$toUpper": datetime.datetime(2024, 1, 2, 3, 4, 5, 6000)}) == (
        "2024-01-02T03:04:05.006Z")
    assert _one(coll, {"$toLower": "$s"}, 2) == "a\u00e9\udcffb"
    assert _one(coll, {"$strcasecmp": ["a", "B"]}) == -1
    assert _one(coll, {"$strcasecmp": ["é", "É"]}) == 1  # bytes after ASCII upper-casing
    assert _one(coll, {"$strcasecmp": ["$nope", None]}) == 0
    assert _one(coll, {"$strcasecmp": ["Hello", "hELLO"]}) == 0
    assert _error(coll, {"$strcasecmp": ["a"]}) == (
        16020, "Expression $strcasecmp takes exactly 2 arguments. 1 were passed in.")
    assert _error(coll, {"$toUpper": {"a": 1}}) == (
        16007, "can't convert from BSON type object to String")


def test_concat(coll: Collection[Any]) -> None:
    assert _one(coll, {"$concat": ["$s", "-", "$s"]}) == "café-café"
    assert _one(coll, {"$concat": []}) == ""
    assert _one(coll, {"$concat": "x"}) == "x"
    assert _one(coll, {"$concat": ["a", "$nope", 1]}) is None  # null before the bad operand
    assert _one(coll, {"$concat": ["$s", "!"]}, 2) == "a\u00e9\udcffb!"
    assert _error(coll, {"$concat": ["a", 1]}) == (16702, "$concat only supports strings, not int")
    assert _error(coll, {"$concat": ["a", "$i"]}) == (16702, "$concat only supports strings, not "
                                                       "int")


def test_regex_find(coll: Collection[Any]) -> None:
    assert _one(coll, {"$regexFind": {"input": "$s", "regex": "f(é)(x)?"}}) == {
        "match": "fé", "idx": 2, "captures": ["é", None]}  # an unmatched group is null
    assert _one(coll, {"$regexFind": {"input": "aébé", "regex": "b"}}) == {
        "match": "b", "idx": 2, "captures": []}  # idx in code points
    assert _one(coll, {"$regexFind": {"input": "ABC", "regex": "b", "options": "i"}}) == {
        "match": "B", "idx": 1, "captures": []}
    assert _one(coll, {"$regexFind": {"input": "a\nb\n", "regex": "b$"}}) == {
        "match": "b", "idx": 2, "captures": []}  # `$` before a final newline, not consuming it
    assert _one(coll, {"$regexFind": {"input": "a1\u0663", "regex": "\\d+"}}) == {
        "match": "1", "idx": 1, "captures": []}  # PCRE without UCP: \d is ASCII
    assert _one(coll, {"$regexFind": {"input": "ABC", "regex": Regex("b", "i")}}) == {
        "match": "B", "idx": 1, "captures": []}
    assert _one(coll, {"$regexFind": {"input": "ab", "regex": "x"}}) is None
    assert _one(coll, {"$regexFind": {"input": "$nope", "regex": "b"}}) is None
    assert _one(coll, {"$regexFind": {"input": "b", "regex": "$n"}}) is None
    assert _error(coll, {"$regexFind": {"input": 1, "regex": "b"}}) == (
        51104, "$regexFind needs 'input' to be of type string")
    assert _error(coll, {"$regexFind": {"input": "a", "regex": 1}}) == (
        51105, "$regexFind needs 'regex' to be of type string or regex")
    assert _error(coll, {"$regexFind": {"input": "a", "regex": "a", "options": 1}}) == (
        51106, "$regexFind needs 'options' to be of type string")
    assert _error(coll, {"$regexFind": {"input": "a", "regex": Regex("a", "i"),
                                        "options": "i"}}) == (
        51107, "$regexFind: found regex option(s) specified in both 'regex' and 'option' fields")
    assert _error(coll, {"$regexFind": {"input": "a", "regex": "a", "options": "g"}}) == (
        51108, "$regexFind invalid flag in regex options: g")
    assert _error(coll, {"$regexFind": {"input": "a"}}) == (
        31023, "$regexFind requires 'regex' parameter")
    assert _error(coll, {"$regexFind": {"regex": "a"}}) == (
        31022, "$regexFind requires 'input' parameter")
    assert _error(coll, {"$regexFind": {"input": "a", "regex": "a", "flags": "i"}}) == (
        31024, "$regexFind found an unknown argument: flags")
    assert _error(coll, {"$regexFind": "a"}) == (
        51103, "$regexFind expects an object of named arguments but found: string")


def test_regex_find_all(coll: Collection[Any]) -> None:
    def matches(text: str, regex: str) -> list[tuple[str, int]]:
        found = _one(coll, {"$regexFindAll": {"input": text, "regex": regex}})
        assert isinstance(found, list)
        return [(m["match"], m["idx"]) for m in found]

    assert matches("abcab", "(a)b") == [("ab", 0), ("ab", 3)]
    assert matches("aébé", "") == [("", 0), ("", 1), ("", 2), ("", 3)]  # none at the end
    assert matches("", "") == [("", 0)]
    assert matches("xax", "a*") == [("", 0), ("a", 1), ("", 2)]
    assert matches("aaa", "a*") == [("aaa", 0)]
    assert _one(coll, {"$regexFindAll": {"input": "$nope", "regex": "a"}}) == []
    assert _one(coll, {"$regexFindAll": {"input": "ab", "regex": "(a)|(b)"}}) == [
        {"match": "a", "idx": 0, "captures": ["a", None]},
        {"match": "b", "idx": 1, "captures": [None, "b"]}]
