"""`$regex` as mongod evaluates it (PCRE2 with UTF, options i m s x u), in linear time where it can.

mongod matches with PCRE2, a backtracking engine bounded by a match limit. Python's `re` is a
backtracking engine without one: `^(a+)+$` on 28 characters runs for seconds. Patterns are
therefore compiled for RE2 (google-re2, linear time) whenever RE2 can express them with PCRE's
meaning; the few it cannot (backreferences, lookaround, atomic groups, possessive quantifiers,
inline `(?x)`...) go to a fallback matcher for Python's `re`, whose syntax and semantics are
PCRE's for those features.

The fallback is a hook (`Fallback`): by default `PythonMatcher`, in-process. This module stays
pure and synchronous; the embedded store's scans pass their own (cdcserver/embedded/regex.py:
a worker process their deadline can stop).

The translation keeps PCRE's meaning where RE2's differs:
- `$` (without `m`) matches at the end and before a final newline in PCRE, only at the end in
  RE2: it becomes `(?:\\n?\\z)` where nothing can follow it (closing parentheses, then the end
  or a top-level alternative), so consuming the newline changes nothing; `\\Z` the same;
  elsewhere the pattern falls back;
- `x` (extended): RE2 has no such mode; whitespace and `#` comments outside classes are removed;
- `{` that does not open a quantifier is a literal in PCRE2 (`python_pattern`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from bson.regex import Regex

from pipeline_stages.errors import MongoError

try:  # the C-backed linear-time engine; without it every pattern uses the fallback
    import re2 as _re2  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - a dependency in pyproject.toml
    _re2 = None  # type: ignore[assignment,unused-ignore]

__all__ = [
    "Fallback",
    "MatchRegex",
    "Matcher",
    "PythonMatcher",
    "as_match_regex",
    "check_options",
    "compile_filter",
    "compile_regex",
    "is_linear",
    "options_of",
    "python_pattern",
    "to_re2",
]

_VALID_FLAGS = "imsux"  # pcre_util::flagsToOptions
_PY_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}
_CACHE_MAX = 512


class Matcher(Protocol):
    """A compiled `$regex`: `search(text)` is true when it matches somewhere in `text`."""

    def search(self, text: str) -> Any: ...


# A byte that was not UTF-8, as bson_bytes decodes it (surrogateescape).
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


class PythonMatcher:
    """The default fallback: Python's `re` (backtracking, no match limit), in-process."""

    linear = False

    def __init__(self, pattern: str, flags: int) -> None:
        self.compiled = re.compile(pattern, flags)  # syntax errors now, at parse time
        self.pattern, self.flags = pattern, flags

    def search(self, text: str) -> bool:
        subject = self.subject(text)
        return subject is not None and self.compiled.search(subject) is not None

    @staticmethod
    def subject(text: str) -> str | None:
        """The string a match runs on (a CollatedStr holds its original: regexes ignore
        collation); None for bytes that are not UTF-8, which PCRE's UTF check fails (so
        does RE2's encode)."""
        text = getattr(text, "original", text)
        return None if _NOT_UTF8.search(text) else text


# The matcher for a pattern RE2 cannot run, from its Python `re` spelling and flags; raises
# re.error (or OverflowError, RecursionError, ValueError) for a pattern Python refuses.
Fallback = Callable[[str, int], Matcher]

_CACHE: dict[tuple[str, str, Fallback], Matcher] = {}


class _Linear:
    linear = True

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled

    def search(self, text: str) -> bool:
        # a CollatedStr holds its original: regexes ignore collation
        try:
            return self._compiled.search(getattr(text, "original", text)) is not None
        except UnicodeEncodeError:  # bytes that are not UTF-8: PCRE's UTF check fails the match
            return False


def check_options(options: str) -> None:
    for flag in options:
        if flag not in _VALID_FLAGS:
            raise MongoError(51108, f" invalid flag in regex options: {flag}")


def compile_regex(pattern: str, options: str = "", fallback: Fallback = PythonMatcher) -> Matcher:
    """A matcher for a `$regex` operand: RE2 when it means the same as PCRE, else `fallback`."""
    key = (pattern, options, fallback)
    found = _CACHE.get(key)
    if found is not None:
        return found
    check_options(options)
    if "\0" in pattern:
        raise MongoError(2, "Regular expression cannot contain an embedded null byte")
    matcher: Matcher | None = _compile_re2(pattern, options)
    if matcher is None:
        flags = 0
        for flag in options:
            flags |= _PY_FLAGS.get(flag, 0)
        try:
            matcher = fallback(python_pattern(pattern), flags)
        except (re.error, OverflowError, RecursionError, ValueError) as exc:
            raise MongoError(51091, f"Regular expression is invalid: {exc}") from None
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = matcher
    return matcher


def is_linear(matcher: Matcher) -> bool:
    """Whether the matcher runs in linear time (RE2), not by backtracking."""
    return bool(getattr(matcher, "linear", False))


def _compile_re2(pattern: str, options: str) -> _Linear | None:
    if _re2 is None:
        return None
    translated = to_re2(pattern, "m" in options, "x" in options)
    if translated is None:
        return None
    prefix = "".join(f for f in "is" if f in options) + ("m" if "m" in options else "")
    if prefix:
        translated = f"(?{prefix}){translated}"
    opts = _re2.Options()
    opts.log_errors = False  # an unsupported pattern is expected: it falls back
    try:
        return _Linear(_re2.compile(translated, opts))
    except Exception:  # noqa: BLE001 - re2.error: a feature RE2 lacks (or PCRE would refuse)
        return None


_PCRE_QUANTIFIER = re.compile(r"\{\d+(?:,\d*)?\}")


def python_pattern(pcre: str) -> str:
    """The Python `re` spelling of a PCRE pattern (also the start of its RE2 spelling).

    The one difference in what both accept: Python reads `{,n}` and `{,}` as quantifiers, PCRE2
    (before 10.43) reads them literally, so every `{` that does not open `{n}`, `{n,}` or
    `{n,m}` is escaped.
    """
    if "{" not in pcre:
        return pcre
    out: list[str] = []
    i = 0
    while i < len(pcre):
        c = pcre[i]
        if c == "\\" and i + 1 < len(pcre):
            out.append(pcre[i : i + 2])
            i += 2
            continue
        if c == "{" and not _PCRE_QUANTIFIER.match(pcre, i):
            out.append("\\{")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def to_re2(pattern: str, multiline: bool, extended: bool) -> str | None:
    """The RE2 spelling of a PCRE pattern, or None when RE2 cannot mean the same."""
    if extended:
        stripped = _strip_extended(pattern)
        if stripped is None:
            return None
        pattern = stripped
    pattern = python_pattern(pattern)  # literal `{`
    if re.search(r"\(\?[a-zA-Z]*m", pattern) or "(?#" in pattern:
        return None  # an inline multiline switch: `$` changes meaning mid-pattern
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    depth = 0
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt == "Q" and not in_class:
                return None  # \Q..\E may hold a `$`; rare enough to leave to the fallback
            if nxt == "Z" and not in_class:
                if not _only_group_end_follows(pattern, i + 2, depth):
                    return None
                out.append(r"(?:\n?\z)")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            i = _open_class(pattern, i, out)
            continue
        if c == "$" and not multiline:
            if not _only_group_end_follows(pattern, i + 1, depth):
                return None
            out.append(r"(?:\n?\z)")
            i += 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        out.append(c)
        i += 1
    return "".join(out)


def _open_class(pattern: str, i: int, out: list[str]) -> int:
    """Copy the `[` at `i` and, right after it, a `]` or `^]`, which PCRE takes as a literal
    member rather than the class's end; the position after them."""
    out.append("[")
    i += 1
    for lead in ("^]", "]"):
        if pattern.startswith(lead, i):
            out.append(lead)
            return i + len(lead)
    return i


def _only_group_end_follows(pattern: str, i: int, depth: int) -> bool:
    """Nothing after position `i` can consume a character: only closing parentheses, then the
    end of the pattern or a top-level alternative."""
    n = len(pattern)
    while i < n and pattern[i] == ")":
        i += 1
        depth -= 1
    return i == n or (pattern[i] == "|" and depth == 0)


_EXTENDED_SPACE = " \t\n\r\f\v"


def _strip_extended(pattern: str) -> str | None:
    """PCRE's extended mode: whitespace and `#...` comments outside classes are not part of
    the pattern."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt == "Q":
                return None
            if nxt in _EXTENDED_SPACE:
                out.append(f"\\x{ord(nxt):02x}")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            i = _open_class(pattern, i, out)
            continue
        if c in _EXTENDED_SPACE:
            i += 1
            continue
        if c == "#":
            end = pattern.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


class MatchRegex(Regex):  # type: ignore[type-arg]
    """A `$regex` operand (a BSON regex, so the query engine treats it as one) with its
    compiled matcher; equal to the BSON regex it was made from."""

    def __init__(self, pattern: str, options: str, fallback: Fallback = PythonMatcher) -> None:
        super().__init__(pattern, _bson_flags(options))
        self.options = options
        self.fallback = fallback
        self.matcher = compile_regex(pattern, options, fallback)

    def try_compile(self) -> Any:  # what mongomock calls to match (a Matcher, not a Pattern)
        return self.matcher


def _bson_flags(options: str) -> int:
    flags = 0
    for flag in options:
        if flag in _PY_FLAGS:
            flags |= _PY_FLAGS[flag]
        elif flag == "u":
            flags |= re.UNICODE
    return flags


def options_of(value: Any) -> str:
    """The MongoDB options string of a BSON regex or a compiled Python pattern."""
    flags = value.flags
    if isinstance(flags, str):
        return flags
    out = ""
    for letter, bit in (("i", re.IGNORECASE), ("m", re.MULTILINE), ("s", re.DOTALL),
                        ("x", re.VERBOSE)):
        if flags & bit:
            out += letter
    if flags & re.UNICODE and not isinstance(value, re.Pattern):
        out += "u"
    return out


def as_match_regex(
    value: Any, options: str | None = None, fallback: Fallback = PythonMatcher
) -> MatchRegex:
    """A `$regex` operand (string, BSON regex, Python pattern) with `$options`, compiled."""
    if isinstance(value, MatchRegex) and options is None and value.fallback is fallback:
        return value
    if isinstance(value, str):
        return MatchRegex(value, options or "", fallback)
    pattern = value.pattern
    if isinstance(pattern, bytes):
        pattern = pattern.decode("utf-8", "replace")
    own = options_of(value)
    if options:  # mongod: $options adds to a regex's own flags
        own += "".join(f for f in options if f not in own)
    return MatchRegex(pattern, own, fallback)


# ---------------------------------------------------------------------------------------------
# Filters


def compile_filter(
    filter_doc: Mapping[str, Any], fallback: Fallback = PythonMatcher
) -> dict[str, Any]:
    """`filter_doc` with every regex operand compiled once (linear time where RE2 can mean the
    same as PCRE, else `fallback`), `$options` folded into its `$regex`. Raises mongod's parse
    errors (invalid options 51108, invalid pattern 51091, options twice 51074/51075)."""
    out: dict[str, Any] = {}
    for key, value in filter_doc.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            out[key] = [
                compile_filter(c, fallback) if isinstance(c, Mapping) else c for c in value
            ]
        elif key.startswith("$"):  # $expr, $where, $jsonSchema...: not match-language regexes
            out[key] = value
        else:
            out[key] = _compile_operand(value, fallback)
    return out


def _is_regex(value: Any) -> bool:
    return isinstance(value, (Regex, re.Pattern))


def _compile_operand(value: Any, fallback: Fallback) -> Any:
    if _is_regex(value):
        return as_match_regex(value, None, fallback)
    if isinstance(value, Mapping) and not value:
        # an equality to {}: the query engine took `{a: {}}` for no condition at all, so a
        # document without `a` matched
        return {"$eq": value}
    if not isinstance(value, Mapping) or not next(iter(value)).startswith("$"):
        return value  # an equality (embedded documents and arrays compare whole)
    return _compile_operators(value, fallback)


def _compile_operators(spec: Mapping[str, Any], fallback: Fallback) -> dict[str, Any]:
    out: dict[str, Any] = {}
    options = spec.get("$options")
    if "$regex" in spec and options is not None:
        if not isinstance(options, str):
            raise MongoError(2, "$options has to be a string")
        own = spec["$regex"]
        if _is_regex(own) and options and options_of(own):
            # mongod's parser meets them in order: 51074 when $options came first
            first = next(k for k in spec if k in ("$regex", "$options"))
            raise MongoError(51074 if first == "$options" else 51075,
                             "options set in both $regex and $options")
    for op, arg in spec.items():
        if op == "$regex" and (isinstance(arg, str) or _is_regex(arg)) and (
            options is None or isinstance(options, str)
        ):
            out[op] = as_match_regex(arg, options, fallback)
        elif op == "$options" and isinstance(arg, str) and isinstance(
            spec.get("$regex"), (str, Regex, re.Pattern)
        ):
            continue  # folded into its $regex
        elif op in ("$in", "$nin") and isinstance(arg, list):
            out[op] = [as_match_regex(v, None, fallback) if _is_regex(v) else v for v in arg]
        elif op == "$not":
            out[op] = _compile_operand(arg, fallback) if _is_regex(arg) or (
                isinstance(arg, Mapping) and arg and next(iter(arg)).startswith("$")
            ) else arg
        elif op == "$elemMatch" and isinstance(arg, Mapping):
            first = next(iter(arg), "")
            operators = first.startswith("$") and first not in ("$and", "$or", "$nor", "$expr",
                                                                 "$where")
            out[op] = (_compile_operators(arg, fallback) if operators
                       else compile_filter(arg, fallback))
        else:
            out[op] = arg
    return out
