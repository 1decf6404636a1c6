"""MongoDB's error shape: `{ok: 0, errmsg, code, codeName[, errorLabels]}`.

Every stage raises `MongoError`; the server turns it into a reply unchanged, so the code,
codeName, message and labels a driver sees are the ones set here.
"""

from __future__ import annotations

from collections.abc import Iterable

# Names from mongod's src/mongo/base/error_codes.yml for the codes cdcserver raises.
# A code without a name is reported as "Location<code>", as mongod does for uassert ids.
CODE_NAMES: dict[int, str] = {
    1: "InternalError",
    2: "BadValue",
    9: "FailedToParse",
    11: "UserNotFound",
    13: "Unauthorized",
    14: "TypeMismatch",
    15: "Overflow",
    18: "AuthenticationFailed",
    20: "IllegalOperation",
    26: "NamespaceNotFound",
    40: "ConflictingUpdateOperators",
    43: "CursorNotFound",
    47: "NoMatchingDocument",
    48: "NamespaceExists",
    50: "MaxTimeMSExpired",
    59: "CommandNotFound",
    72: "InvalidOptions",
    73: "InvalidNamespace",
    96: "OperationFailed",
    112: "WriteConflict",
    115: "CommandNotSupported",
    125: "CommandFailed",
    207: "InvalidUUID",
    251: "NoSuchTransaction",
    260: "InvalidResumeToken",
    263: "OperationNotSupportedInTransaction",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    292: "CursorInUse",
    323: "APIStrictError",
    326: "OplogQueryMinTsMissing",
    166: "CommandNotSupportedOnView",
    234: "RetryChangeStream",
    10334: "BSONObjectTooLarge",
    346: "ChangeStreamInvalidated",
    11000: "DuplicateKey",
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
