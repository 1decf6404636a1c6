"""`$dateFromString` as mongod 8.0 evaluates it (expression.cpp ExpressionDateFromString,
date_time_support.cpp TimeZoneDatabase::fromString, timelib's parse_date.re).

The arguments are checked as mongod does (40540-40542; `format` must be a string, 40684, whose
`%` specifiers are validated, 18535 / 18536), then: the `timezone` evaluated (a nullish one
gives null), a nullish `dateString` gives `onNull` (null by default), and a ConversionFailure
(241) gives `onError` when it is given.

With a `format`, the string is read as timelib_parse_from_format_with_map reads it with
mongod's specifiers (`%b %B %d %G %H %L %m %M %S %u %V %Y %z %Z %%`): every error and warning
collected at its byte position ("Error parsing date string '<s>'; <position>: <message>
'<character>'", the character a NUL at the end of the string), ISO week dates converted, an
invalid time or date a warning (also an error for mongod). Without one, the forms users write
are read as timelib_strtotime reads them: `YYYY-MM-DD`, optionally `T` or a space and
`HH:MM[:SS[.fraction]]` (`:` or `.` between the fields), optionally an offset (`+HH`, `+HHMM`,
`+HH:MM`, `GMT+HH:MM`...), `Z`, a military zone letter, `UTC` or `GMT`. Then, as fromString:
an incomplete date or time is refused, a zone in the string with a `timezone` argument other
than "UTC" is refused, and the local time is converted by the zone (the string's, else the
argument's).

Left refused (code 2, "not supported"): strings without a format in any other form (timelib's
natural-language forms, time-only strings, the empty string...), zone abbreviations other than
UTC / GMT / the military letters (timelib's abbreviation table: EST, CEST...), error messages
whose character is not ASCII, and dates outside years 1-9999.

Pure and synchronous. Installed into the expression parser by expressions.py (`OPERATORS`).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from typing import Any

from pipeline_stages import date_expressions
from pipeline_stages.array_expressions import value
from pipeline_stages.date_expressions import MISSING, missing_type_name, nullish, operand
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name, value_string

__all__ = ["OPERATORS"]

_NAME = "$dateFromString"
_ARGUMENTS = ("format", "dateString", "timezone", "onNull", "onError")
_SPECIFIERS = frozenset("bBdGHLmMSuVYzZ")
_UNSET = None
_OFFSET, _ABBR = 1, 2
_EPOCH = datetime.datetime(1970, 1, 1)
_MONTHS = {
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6, "jul": 7, "aug": 8, "sep": 9,
    "sept": 9, "oct": 10, "nov": 11, "dec": 12, "i": 1, "ii": 2, "iii": 3, "iv": 4, "v": 5,
    "vi": 6, "vii": 7, "viii": 8, "ix": 9, "x": 10, "xi": 11, "xii": 12, "january": 1,
    "february": 2, "march": 3, "april": 4, "june": 6, "july": 7, "august": 8, "september": 9,
    "october": 10, "november": 11, "december": 12,
}


class _Unsupported(Exception):
    pass


class _ConversionFailure(Exception):
    pass


def _unsupported(what: str) -> _Unsupported:
    return _Unsupported(f"not supported by cdcserver's embedded store: {_NAME} {what}")


# -- the parsed time ---------------------------------------------------------------------------


class _Time:
    """timelib_time's fields this parser sets (None: TIMELIB_UNSET)."""

    def __init__(self) -> None:
        self.y: int | None = _UNSET
        self.m: int | None = _UNSET
        self.d: int | None = _UNSET
        self.h: int | None = _UNSET
        self.i: int | None = _UNSET
        self.s: int | None = _UNSET
        self.us: int | None = _UNSET
        self.z = 0  # seconds east of UTC
        self.dst = 0
        self.zone_type = 0
        self.tz_abbr = ""


class _Messages:
    """timelib_error_container: (position, message, character) errors and warnings."""

    def __init__(self, text: bytes) -> None:
        self.text = text  # NUL-terminated
        self.errors: list[tuple[int, str, int]] = []
        self.warnings: list[tuple[int, str, int]] = []

    def error(self, message: str, at: int) -> None:
        self.errors.append((at, message, self.text[at]))

    def warning(self, message: str, at: int) -> None:
        self.warnings.append((at, message, self.text[at]))


def _days_in_month(y: int, m: int) -> int:
    if m == 2:
        return 29 if (y % 4 == 0 and y % 100 != 0) or y % 400 == 0 else 28
    return 30 if m in (4, 6, 9, 11) else 31


def _valid_time(h: int, i: int, s: int) -> bool:
    return 0 <= h <= 23 and 0 <= i <= 59 and 0 <= s <= 59


def _valid_date(y: int, m: int, d: int) -> bool:
    return 1 <= m <= 12 and 1 <= d <= _days_in_month(y, m)


# -- timelib's scanning helpers (on NUL-terminated bytes) --------------------------------------


def _digit(c: int) -> bool:
    return 0x30 <= c <= 0x39


def _get_nr(s: bytes, p: int, max_length: int) -> tuple[int | None, int, int]:
    """timelib_get_nr_ex: (number or None, new position, digits read); non-digits skipped."""
    while not _digit(s[p]):
        if s[p] == 0:
            return None, p, 0
        p += 1
    begin = p
    while _digit(s[p]) and p - begin < max_length:
        p += 1
    return int(s[begin:p]), p, p - begin


def _strtol(s: bytes, p: int) -> int:
    end = p
    while _digit(s[end]):
        end += 1
    return int(s[p:end]) if end > p else 0


def _parse_tz_cor(s: bytes, p: int) -> tuple[int | None, int]:
    """timelib_parse_tz_cor: seconds (None: not found), new position."""
    begin = p
    while _digit(s[p]) or s[p] == 0x3A:
        p += 1
    n = p - begin

    def hours(at: int) -> int:
        return _strtol(s, at) * 3600

    if n in (1, 2):
        return hours(begin), p
    if n in (3, 4):
        if s[begin + 1] == 0x3A:
            return hours(begin) + _strtol(s, begin + 2) * 60, p
        if s[begin + 2] == 0x3A:
            return hours(begin) + _strtol(s, begin + 3) * 60, p
        number = _strtol(s, begin)
        return (number // 100) * 3600 + (number % 100) * 60, p
    if n == 5 and s[begin + 2] == 0x3A:
        return hours(begin) + _strtol(s, begin + 3) * 60, p
    if n == 6:
        number = _strtol(s, begin)
        return (number // 10000) * 3600 + ((number // 100) % 100) * 60 + number % 100, p
    if n == 8 and s[begin + 2] == 0x3A and s[begin + 5] == 0x3A:
        return hours(begin) + _strtol(s, begin + 3) * 60 + _strtol(s, begin + 6), p
    return None, p


def _military(letter: str) -> int | None:
    """The military time zones of timelib's table: A-I +1..+9, K-M +10..+12, N-Y -1..-12, Z 0."""
    c = letter.lower()
    if c == "z":
        return 0
    if "a" <= c <= "i":
        return (ord(c) - ord("a") + 1) * 3600
    if "k" <= c <= "m":
        return (ord(c) - ord("k") + 10) * 3600
    if "n" <= c <= "y":
        return -(ord(c) - ord("n") + 1) * 3600
    return None


def _abbreviation(word: str) -> int | None:
    """abbr_search's offset for the abbreviations known here; None when not found; raises
    for a word timelib's table might hold."""
    if len(word) >= 6 or not word:  # MAX_ABBR_LEN: never looked up
        return None
    if word.lower() in ("utc", "gmt"):
        return 0
    if len(word) == 1 and word.isalpha() and word.isascii():
        return _military(word)
    if word.isascii() and word.isalpha():
        raise _unsupported(f"with the time zone abbreviation '{word}'")
    return None


def _parse_zone(s: bytes, p: int, t: _Time) -> tuple[bool, int]:
    """timelib_parse_zone: (found, new position); sets the offset and zone type."""
    while s[p] in b" \t(" and s[p] != 0:
        p += 1
    if s[p:p + 3] == b"GMT" and s[p + 3] in b"+-" and s[p + 3] != 0:
        p += 3
    found = True
    if s[p] in (0x2B, 0x2D):
        sign = 1 if s[p] == 0x2B else -1
        p += 1
        t.zone_type, t.dst = _OFFSET, 0
        seconds, p = _parse_tz_cor(s, p)
        found = seconds is not None
        t.z = sign * (seconds or 0)
    else:
        begin = p
        while s[p] != 0 and (chr(s[p]).isascii() and (chr(s[p]).isalnum() or s[p] in b"/_-+")):
            p += 1
        word = s[begin:p].decode("ascii")
        offset = _abbreviation(word)
        if offset is None:
            found = False
        else:
            t.zone_type, t.dst, t.z = _ABBR, 0, offset
            t.tz_abbr = word.upper()
    while s[p] == 0x29:
        p += 1
    return found, p


def _iso_to_date(year: int, week: int, day: int) -> tuple[int, int, int]:
    """timelib_date_from_isodate."""
    if not 1 <= year <= 9999:
        raise _unsupported("with an ISO year outside 1-9999")
    jan4 = datetime.date(year, 1, 4)
    monday = jan4 - datetime.timedelta(days=jan4.isoweekday() - 1)
    try:
        moment = monday + datetime.timedelta(days=(week - 1) * 7 + day - 1)
    except OverflowError:
        raise _unsupported("with an ISO date outside years 1-9999") from None
    return moment.year, moment.month, moment.day


# -- with a format -----------------------------------------------------------------------------


def _validate_format(fmt: str) -> None:
    """validateFormat with kDateFromStringFormatMap."""
    i = 0
    while i < len(fmt):
        if fmt[i] == "%":
            i += 1
            if i == len(fmt):
                raise MongoError(18535, "Unmatched '%' at end of format string")
            if fmt[i] != "%" and fmt[i] not in _SPECIFIERS:
                raise MongoError(18536, f"Invalid format character '%{fmt[i]}' in format string")
        i += 1


def _nul_terminated(text: str) -> bytes:
    raw = text.encode("utf-8")
    cut = raw.find(b"\0")
    return (raw if cut < 0 else raw[:cut]) + b"\0"


def _parse_with_format(text: str, fmt: str) -> tuple[_Time, _Messages]:
    s = _nul_terminated(text)
    f = _nul_terminated(fmt)
    t = _Time()
    out = _Messages(s)
    p = fp = 0
    prefix_found = False
    iso_year: int | None = None
    iso_week: int | None = None
    iso_day: int | None = None

    def check_number(at: int, begin: int) -> None:
        if not _digit(s[at]):
            out.error("Unexpected data found.", begin)

    while f[fp] != 0 and s[p] != 0:
        begin = p
        fc = f[fp]
        if (not prefix_found and fc != 0x25) or (prefix_found and fc == 0x25):
            if fc != s[p]:
                out.error("Format literal not found", begin)
            p += 1
            fp += 1
            prefix_found = False
            continue
        if fc == 0x25:
            fp += 1
            prefix_found = True
            continue
        prefix_found = False
        spec = chr(fc)
        if spec in "dmHY":
            check_number(p, begin)
            number, p, _ = _get_nr(s, p, 4 if spec == "Y" else 2)
            if number is None:
                out.error({"d": "A two digit day could not be found",
                           "m": "A two digit month could not be found",
                           "H": "A two digit hour could not be found",
                           "Y": "A four digit year could not be found"}[spec], begin)
            elif spec == "d":
                t.d = number
            elif spec == "m":
                t.m = number
            elif spec == "H":
                t.h = number
            else:
                t.y = number
        elif spec in "MS":
            check_number(p, begin)
            number, p, length = _get_nr(s, p, 2)
            if number is None or length != 2:
                out.error("A two digit minute could not be found" if spec == "M" else
                          "A two digit second could not be found", begin)
            elif spec == "M":
                t.i = number
            else:
                t.s = number
        elif spec == "L":
            check_number(p, begin)
            start = p
            number, p, _ = _get_nr(s, p, 3)
            if number is None or p - start < 1:
                out.error("A three digit millisecond could not be found", begin)
            else:
                t.us = int(number * 10.0 ** (3 - (p - start)) * 1000)
        elif spec in "bB":
            start = p
            while 0x41 <= s[p] <= 0x5A or 0x61 <= s[p] <= 0x7A:
                p += 1
            month = _MONTHS.get(s[start:p].decode("ascii").lower(), 0)
            if not month:
                out.error("A textual month could not be found", begin)
            else:
                t.m = month
        elif spec == "G":
            number, p, _ = _get_nr(s, p, 4)
            if number is None:
                out.error("A four digit ISO year could not be found", begin)
            else:
                iso_year = number
        elif spec == "V":
            number, p, _ = _get_nr(s, p, 2)
            if number is None:
                out.error("A two digit ISO week could not be found", begin)
            elif not 1 <= number <= 53:
                iso_week = number
                out.error("ISO Week must be between 1 and 53", begin)
            else:
                iso_week = number
        elif spec == "u":
            number, p, _ = _get_nr(s, p, 1)
            if number is None:
                out.error("A single digit day of week could not be found", begin)
            elif not 1 <= number <= 7:
                iso_day = number
                out.error("Day of week must be between 1 and 7", begin)
            else:
                iso_day = number
        elif spec == "z":
            found, p = _parse_zone(s, p, t)
            if not found:
                out.error("", begin)  # TIMELIB_ERR_TZID_NOT_FOUND: mongod's own text
        else:  # "Z": timelib_parse_tz_minutes
            if s[p] not in (0x2B, 0x2D) or s[p] == 0:
                out.error("Invalid timezone offset in minutes", begin)
            else:
                sign = 1 if s[p] == 0x2B else -1
                p += 1
                digits = p
                while _digit(s[p]):
                    p += 1
                t.zone_type, t.dst = _OFFSET, 0
                t.z = sign * (int(s[digits:p]) if p > digits else 0) * 60
        fp += 1
    if s[p] != 0:
        out.error("Trailing data", p)
    if f[fp] != 0:
        out.error("Not enough data available to satisfy format", p)
    if t.h is not None or t.i is not None or t.s is not None or t.us is not None:
        t.h, t.i, t.s, t.us = t.h or 0, t.i or 0, t.s or 0, t.us or 0
    iso_given = iso_week is not None or iso_year is not None or iso_day is not None
    if t.y is not None and iso_given:
        out.error("Mixing of ISO dates with natural dates is not allowed", p)
    if iso_year is not None and (t.y is not None or t.m is not None or t.d is not None):
        out.error("Mixing of ISO dates with natural dates is not allowed", p)
    if iso_year is not None:
        t.y, t.m, t.d = _iso_to_date(iso_year, iso_week or 1, iso_day or 1)
    elif iso_week is not None or iso_day is not None:
        out.warning("The parsed date was invalid", p)
    if t.h is not None and t.i is not None and t.s is not None and not _valid_time(
            t.h, t.i, t.s):
        out.warning("The parsed time was invalid", p)
    if t.y is not None and t.m is not None and t.d is not None and not _valid_date(
            t.y, t.m, t.d):
        out.warning("The parsed date was invalid", p)
    return t, out


# -- without a format ------------------------------------------------------------------------

_ISO = re.compile(
    r"(\d{4})-(0\d|1[0-2])-(0\d|[12]\d|3[01])"
    r"(?:[Tt ]([01]\d|2[0-4])[:.]([0-5]\d)(?:[:.]([0-5]\d|60)(\.\d+)?)?"
    r"([ \t]?(?:[A-SU-Za-su-z]|(?i:utc|gmt)|(?:GMT)?[+-](?:[01]\d|2[0-4])(?::?[0-5]\d)?))?)?"
)


def _parse_iso(text: str) -> tuple[_Time, _Messages]:
    match = _ISO.fullmatch(text)
    if match is None or text != text.strip():
        raise _unsupported(f"of '{text}' without a format (only ISO 8601 forms are read)")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    s = _nul_terminated(text)
    t = _Time()
    out = _Messages(s)
    t.y, t.m, t.d = int(year), int(month), int(day)
    if hour is not None:
        t.h, t.i, t.s, t.us = int(hour), int(minute), int(second or 0), 0
        if fraction is not None:  # timelib_get_frac_nr
            t.us = int(float(fraction[1:]) * 10.0 ** (7 - len(fraction)))
    if zone is not None:
        found, _ = _parse_zone(s, len(s) - 1 - len(zone.encode()), t)
        if not found:
            raise _unsupported(f"of '{text}' without a format")
    if t.h is not None and not _valid_time(t.h, t.i or 0, t.s or 0):
        out.warning("The parsed time was invalid", len(s) - 1)
    if not _valid_date(t.y, t.m, t.d):
        out.warning("The parsed date was invalid", len(s) - 1)
    return t, out


# -- the conversion ----------------------------------------------------------------------------


def _error_text(text: str, out: _Messages) -> str:
    parts = [f"Error parsing date string '{text}'"]
    for position, message, character in out.errors + out.warnings:
        if character >= 0x80:
            raise _unsupported("with an error at a non-ASCII character")
        if not message:
            message = "passing a time zone identifier as part of the string is not allowed"
        parts.append(f"; {position}: {message} '{chr(character)}'")
    return "".join(parts)


def _from_string(text: str, fmt: str | None, zone: Any, utc_zone: bool) -> datetime.datetime:
    t, out = _parse_iso(text) if fmt is None else _parse_with_format(text, fmt)
    if out.errors or out.warnings:
        raise _ConversionFailure(_error_text(text, out))
    if t.h is None and t.i is None and t.s is None:
        t.h = t.i = t.s = t.us = 0
    if None in (t.y, t.m, t.d, t.h, t.i, t.s):
        raise _ConversionFailure("an incomplete date/time string has been found, with elements "
                                 f'missing: "{text}"')
    if not utc_zone:
        if t.zone_type == _OFFSET:
            raise _ConversionFailure("you cannot pass in a date/time string with GMT offset "
                                     "together with a timezone argument")
        if t.zone_type == _ABBR:
            raise _ConversionFailure("you cannot pass in a date/time string with time zone "
                                     f"information ('{t.tz_abbr}') together with a timezone "
                                     "argument")
    assert t.y is not None and t.m is not None and t.d is not None
    assert t.h is not None and t.i is not None and t.s is not None
    if not 1 <= t.y <= 9999:
        raise _unsupported("of a date outside years 1-9999")
    local = datetime.datetime(t.y, t.m, t.d, t.h, t.i, t.s)
    if t.zone_type:
        seconds = (local - _EPOCH).days * 86_400 + (local - _EPOCH).seconds - t.z
        micros = seconds * 1_000_000 + (t.us or 0)
    else:
        micros = zone.utc_of_local(local) * 1000 + (t.us or 0)
    ms = -(-micros // 1000) if micros < 0 else micros // 1000  # toward zero
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def _date_from_string(parser: Any, spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        raise MongoError(40540, f"{_NAME} only supports an object as an argument, found: "
                         f"{type_name(spec)}")
    for key in spec:
        if key not in _ARGUMENTS:
            raise MongoError(40541, f"Unrecognized argument to {_NAME}: {key}")
    if "dateString" not in spec:
        raise MongoError(40542, f"Missing 'dateString' parameter to {_NAME}")
    date_string = value(parser, spec["dateString"])
    fmt: Any = MISSING
    if "format" in spec:
        fmt = value(parser, spec["format"])
        if not nullish(fmt):
            if not isinstance(fmt, str):
                raise MongoError(40684, f"{_NAME} requires that 'format' be a string, found: "
                                 f"{missing_type_name(fmt)} with value {value_string(fmt)}")
            _validate_format(fmt)
    zone = date_expressions._zone(parser, spec, None)
    if nullish(date_string):
        return value(parser, spec["onNull"]) if "onNull" in spec else None
    try:
        try:
            if not isinstance(date_string, str):
                raise _ConversionFailure(
                    f"{_NAME} requires that 'dateString' be a string, found: "
                    f"{type_name(date_string)} with value {value_string(date_string)}")
            if zone is None:
                return None
            if "format" in spec and nullish(fmt):
                return None
            utc_zone = "timezone" not in spec or operand(parser, spec["timezone"]) == "UTC"
            return _from_string(date_string, fmt if "format" in spec else None, zone, utc_zone)
        except _ConversionFailure as failure:
            if "onError" in spec:
                return value(parser, spec["onError"])
            raise MongoError(241, str(failure)) from None
    except _Unsupported as refused:
        raise MongoError(2, str(refused)) from None


OPERATORS: dict[str, Callable[[Any, Any], Any]] = {"$dateFromString": _date_from_string}
