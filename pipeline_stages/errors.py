"""MongoDB's error shape: `{ok: 0, errmsg, code, codeName[, errorLabels]}`.

Every stage raises `MongoError`; the server turns it into a reply unchanged, so the code,
codeName, message and labels a driver sees are the ones set here.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline_stages.error_codes import CATEGORIES, ERROR_CODES

# codeName of every code mongod names (pipeline_stages/error_codes.py, generated from mongod's
# src/mongo/base/error_codes.yml). A code without a name is reported as "Location<code>", as
# mongod does for uassert ids.
CODE_NAMES: dict[int, str] = {
    code: name
    for code, name in ERROR_CODES.items()
    # The IDL parse codes (40413-40415, 4662500) were named after 8.0: mongod 8.0 reports an
    # unknown field as Location40415 (tests/pipeline_stages/test_spec.py,
    # tests/server/test_write_command_parsing.py).
    if code not in CATEGORIES["IDLParseError"]
}


def code_name(code: int) -> str:
    return CODE_NAMES.get(code, f"Location{code}")


class MongoError(Exception):
    """An error as mongod reports it for one request."""

    def __init__(self, code: int, errmsg: str, labels: Iterable[str] = ()) -> None:
        super().__init__(errmsg)
        self.code = code
        self.errmsg = errmsg
        self.labels: list[str] = list(labels)

    @property
    def code_name(self) -> str:
        return code_name(self.code)

    def to_reply(self) -> dict[str, object]:
        """The command-reply fields, in mongod's order."""
        reply: dict[str, object] = {
            "ok": 0.0,
            "errmsg": self.errmsg,
            "code": self.code,
            "codeName": self.code_name,
        }
        if self.labels:
            reply["errorLabels"] = list(self.labels)
        return reply

    def __repr__(self) -> str:
        return f"MongoError({self.code}, {self.errmsg!r})"


class KeyStringError(MongoError):
    """A malformed KeyString; mongod prefixes these messages with 'KeyString format error: '."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, f"KeyString format error: {detail}")
