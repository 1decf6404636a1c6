"""Collation: strings compared by their collation key (an approximation of ICU's sort keys:
base letters, then diacritics, then case, as `strength` / `caseLevel` / `caseFirst` /
`numericOrdering` ask). Pure: the change stream's `$match` (the aggregate's `collation`) and
the embedded store's queries both use it.

A filter is rewritten so its compared strings are keys, and a document so its strings are
`CollatedStr`s (a key that remembers its original, for regexes, which ignore collation); the
ordinary matcher then compares keys.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

__all__ = ["CollatedStr", "Collation", "parse_collation"]

# Operators whose argument is not a value compared with the field's (kept as given).
_NOT_COMPARED = frozenset({
    "$regex", "$options", "$type", "$exists", "$size", "$mod", "$where", "$expr",
    "$jsonSchema", "$text", "$comment", "$bitsAllSet", "$bitsAllClear", "$bitsAnySet",
    "$bitsAnyClear", "$geoWithin", "$geoIntersects", "$near", "$nearSphere", "$within",
    "$maxDistance", "$minDistance",
})


class CollatedStr(str):
    """A string as its collation key (for comparisons), with its original value (for regexes,
    which ignore collation)."""

    __slots__ = ("original",)
    original: str


_DIGITS = re.compile(r"\d+")


def _numeric(text: str) -> str:
    """Digit runs made to compare by value: a marker, the count of significant digits,
    then the digits."""
    def run(m: re.Match[str]) -> str:
        digits = m.group().lstrip("0") or "0"
        return f"0{chr(0x30 + min(len(digits), 0xFFFF))}{digits}"

    return _DIGITS.sub(run, text)


class Collation:
    def __init__(self, strength: int, case_level: bool, upper_first: bool = False,
                 numeric: bool = False) -> None:
        self.strength = strength
        self.case_level = case_level
        self.upper_first = upper_first
        self.numeric = numeric
        self.spec = {"strength": strength, "caseLevel": case_level, "upper": upper_first,
                     "numeric": numeric}

    def key(self, text: str) -> str:
        """Levels joined by \x01 (below any character a string is expected to hold), so
        that keys compare level by level like ICU's sort keys: base letters, then (strength
        2) diacritics, then (caseLevel, or strength 3 and more) case, lowercase first unless
        caseFirst is "upper"."""
        if self.numeric:
            text = _numeric(text)
        decomposed = unicodedata.normalize("NFD", text)
        folded = unicodedata.normalize("NFD", text.casefold())
        levels = ["".join(c for c in folded if not unicodedata.combining(c))]
        if self.strength >= 2:
            levels.append(folded)
        if self.case_level or self.strength >= 3:
            cased = decomposed if self.upper_first else decomposed.swapcase()
            if self.strength == 1:  # caseLevel alone: case without diacritics
                cased = "".join(c for c in cased if not unicodedata.combining(c))
            levels.append(cased)
        return "\x01".join(levels)

    def value(self, value: Any) -> Any:
        """A document or value with every string replaced by its CollatedStr."""
        if isinstance(value, str):
            keyed = CollatedStr(self.key(value))
            keyed.original = value
            return keyed
        if isinstance(value, Mapping):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value

    def filter(self, filter_doc: Mapping[str, Any]) -> dict[str, Any]:
        """A filter with its compared strings replaced by their keys."""
        out: dict[str, Any] = {}
        for key, arg in filter_doc.items():
            if key in ("$and", "$or", "$nor") and isinstance(arg, list):
                out[key] = [self.filter(c) if isinstance(c, Mapping) else c for c in arg]
            elif key.startswith("$"):
                out[key] = arg
            else:
                out[key] = self._operand(arg)
        return out

    def _operand(self, arg: Any) -> Any:
        if isinstance(arg, Mapping) and arg and next(iter(arg)).startswith("$"):
            out: dict[str, Any] = {}
            for op, value in arg.items():
                if op in _NOT_COMPARED:
                    out[op] = value
                elif op == "$not":
                    out[op] = self._operand(value)
                elif op == "$elemMatch" and isinstance(value, Mapping):
                    first = next(iter(value), "")
                    out[op] = (self._operand(value) if first.startswith("$")
                               and first not in ("$and", "$or", "$nor") else self.filter(value))
                else:
                    out[op] = self.value(value)
            return out
        return self.value(arg)


def parse_collation(spec: Any, where: str = "find") -> Collation | None:
    """The collation a command's `collation` field asks for; None for the simple (binary)
    one. `where` names the command in the type error ('BSON field 'find.collation' ...')."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise MongoError(14, f"BSON field '{where}.collation' is the wrong type "
                         f"'{type_name(spec)}', expected type 'object'")
    locale = spec.get("locale")
    if locale is None:
        raise MongoError(40414, "BSON field 'locale' is missing but a required field")
    if not isinstance(locale, str):
        raise MongoError(14, "BSON field 'locale' is the wrong type, expected type 'string'")
    if locale == "simple":
        return None
    strength = spec.get("strength", 3)
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not (
        1 <= strength <= 5
    ):
        raise MongoError(51024, "BSON field 'strength' value must be >= 1 and <= 5, actual "
                         f"value '{strength}'")
    return Collation(int(strength), spec.get("caseLevel") is True,
                     spec.get("caseFirst") == "upper", spec.get("numericOrdering") is True)
