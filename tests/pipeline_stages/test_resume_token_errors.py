"""Malformed client tokens get mongod's code, codeName and message (resume_token.cpp getData,
key_string.cpp toBsonSafe); tokens mongod refuses to build are refused here too."""

from __future__ import annotations

import pytest
from bson.binary import Binary
from bson.timestamp import Timestamp

from pipeline_stages import resume_token as rt
from pipeline_stages.errors import MongoError

TS = "82" + "6351" + "5EAC" + "00000002"  # Timestamp(1666277036, 2)
UUID = "5A1004" + "AB1154ACACD849A48C61756D70D3B21F"
V1 = "2B02"
V2 = "2B04"
EVENT = "2C0100"
HWM = "29"
ZERO = "29"
FALSE = "6E"
IDENT = "46" + "3C" + "6F7065726174696F6E5479706500" + "3C64726F700000"  # {operationType: "drop"}
END = "04"


def check(token: dict, code: int, code_name: str, errmsg: str) -> None:
    with pytest.raises(MongoError) as err:
        rt.decode(token)
    e = err.value
    assert (e.code, e.code_name, e.errmsg) == (code, code_name, errmsg)
    reply = e.to_reply()
    assert list(reply) == ["ok", "errmsg", "code", "codeName"]
    assert reply["ok"] == 0.0


BAD_TOKENS = [
    # shape of the token document (ResumeToken(Document))
    pytest.param({}, 40647, "Location40647",
                 "Bad resume token: _data of missing or of wrong type. Expected string, got {}",
                 id="40647-missing"),
    pytest.param({"_data": 5}, 40647, "Location40647",
                 "Bad resume token: _data of missing or of wrong type. Expected string, got "
                 "{_data: 5}", id="40647-int"),
    pytest.param({"_data": TS + V2 + END, "_typeBits": "AA"}, 40648, "Location40648",
                 f'Bad resume token: _typeBits of wrong type {{_data: "{TS}{V2}{END}", '
                 '_typeBits: "AA"}', id="40648-string"),
    pytest.param({"_data": "04", "_typeBits": Binary(b"\x01", 4)}, 40648, "Location40648",
                 'Bad resume token: _typeBits of wrong type {_data: "04", _typeBits: '
                 "BinData(4, 01)}", id="40648-subtype"),
    # hex
    pytest.param({"_data": "8Z"}, 9, "FailedToParse",
                 "resume token string was not a valid hex string", id="9-nonhex"),
    pytest.param({"_data": TS + "0"}, 9, "FailedToParse",
                 "resume token string was not a valid hex string", id="9-odd"),
    pytest.param({"_data": "82 00"}, 9, "FailedToParse",
                 "resume token string was not a valid hex string", id="9-space"),
    # KeyString
    pytest.param({"_data": ""}, 40649, "Location40649", "invalid empty resume token",
                 id="40649-empty"),
    pytest.param({"_data": "04"}, 40649, "Location40649", "invalid empty resume token",
                 id="40649-end-only"),
    pytest.param({"_data": "0000000000"}, 50811, "Location50811",
                 "KeyString format error: Unknown type: 0", id="50811-zero"),
    pytest.param({"_data": "A5554D56FF"}, 50811, "Location50811",
                 "KeyString format error: Unknown type: 165", id="50811-A5"),
    pytest.param({"_data": "3C37"}, 50816, "Location50816",
                 "KeyString format error: Failed to find null terminator in string.",
                 id="50816"),
    pytest.param({"_data": "04", "_typeBits": Binary(bytes.fromhex("A5554D56FF"), 0)}, 15,
                 "Overflow", "Invalid advance (37) past end of buffer[4] at offset: 0",
                 id="15-typebits-overrun"),
    # v1 token with {_id: {a: 1, b: 2}}: 10 type bits, but one byte of them supplied
    pytest.param({"_data": TS + V1 + EVENT + ZERO + FALSE + UUID
                  + "46465F696400461E61002B021E62002B04000004",
                  "_typeBits": Binary(b"\x01", 0)}, 50615, "Location50615",
                 "KeyString format error: Invalid size byte(s).", id="50615"),
    # the token's fields (ResumeToken::getData)
    pytest.param({"_data": TS + END}, 50796, "Location50796",
                 "Resume Token does not contain version", id="50796"),
    pytest.param({"_data": TS + V2 + END, "_typeBits": Binary(b"\x02", 0)}, 50854,
                 "Location50854", "Invalid resume token: wrong type for version",
                 id="50854-long"),
    pytest.param({"_data": TS + "3C7800" + END}, 50854, "Location50854",
                 "Invalid resume token: wrong type for version", id="50854-string"),
    pytest.param({"_data": TS + "2B06" + END}, 50795, "Location50795",
                 "Invalid Resume Token: only supports version 0, 1 and 2", id="50795"),
    pytest.param({"_data": TS + V1 + END}, 51055, "Location51055",
                 "Resume Token does not contain tokenType", id="51055"),
    pytest.param({"_data": TS + V1 + EVENT + END, "_typeBits": Binary(b"\x08", 0)}, 51056,
                 "Location51056", "Resume Token tokenType is not an int.", id="51056"),
    pytest.param({"_data": TS + V1 + "2B0A" + END}, 51057, "Location51057",
                 "Token type 5 not recognized", id="51057"),
    pytest.param({"_data": TS + V1 + EVENT + END}, 50793, "Location50793",
                 "Resume Token does not contain txnOpIndex", id="50793"),
    pytest.param({"_data": TS + V1 + EVENT + "2B02" + END, "_typeBits": Binary(b"\x20", 0)},
                 50855, "Location50855", "Resume Token txnOpIndex is not an integer",
                 id="50855"),
    pytest.param({"_data": TS + V1 + EVENT + "27FD" + END}, 50794, "Location50794",
                 "Invalid Resume Token: txnOpIndex should be non-negative", id="50794"),
    pytest.param({"_data": TS + V1 + EVENT + ZERO + END}, 50872, "Location50872",
                 "Resume Token does not contain fromInvalidate", id="50872"),
    pytest.param({"_data": TS + V1 + EVENT + ZERO + "14" + END}, 50870, "Location50870",
                 "Resume Token fromInvalidate is not a boolean.", id="50870"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + END}, 6189500, "Location6189500",
                 "Expected UUID or null", id="6189500"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + "2B02" + END}, 207, "InvalidUUID",
                 "uuid must be a 16-byte binary field with UUID (4) subtype", id="207-int"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + "5A100300112233445566778899AABBCC"
                  "DDEEFF" + END}, 207, "InvalidUUID",
                 "uuid must be a 16-byte binary field with UUID (4) subtype", id="207-subtype3"),
    pytest.param({"_data": TS + V2 + HWM + ZERO + FALSE + "14" + IDENT + END}, 6189504,
                 "Location6189504", "Invalid high water mark token", id="6189504"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + "14" + END}, 6189501,
                 "Location6189501", "Expected an eventIdentifier for an event resume token",
                 id="6189501"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + UUID + "3C7800" + END}, 6189503,
                 "Location6189503", "Resume Token eventIdentifier is not an object",
                 id="6189503"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + UUID + IDENT + "27FD" + END},
                 7182501, "Location7182501",
                 "Resume token 'fragmentNum' must be a non-negative integer.", id="7182501-neg"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + UUID + IDENT + "3C7800" + END},
                 7182501, "Location7182501",
                 "Resume token 'fragmentNum' must be a non-negative integer.",
                 id="7182501-string"),
    pytest.param({"_data": TS + V2 + EVENT + ZERO + FALSE + UUID + IDENT + "2B02" + "2B02" + END},
                 40646, "Location40646", "invalid oversized resume token", id="40646-v2"),
    pytest.param({"_data": TS + V1 + EVENT + ZERO + FALSE + UUID + IDENT + "2B02" + END},
                 40646, "Location40646", "invalid oversized resume token", id="40646-v1"),
]


@pytest.mark.parametrize(("token", "code", "code_name", "errmsg"), BAD_TOKENS)
def test_malformed_token(token, code, code_name, errmsg):
    check(token, code, code_name, errmsg)


def test_type_bits_are_read_before_the_hex_is_validated():
    # mongod parses _typeBits first, so a broken _typeBits wins over a broken _data.
    check({"_data": "zz", "_typeBits": Binary(b"\x85", 0)}, 15, "Overflow",
          "Invalid advance (5) past end of buffer[0] at offset: 0")


def test_lower_case_hex_is_accepted_and_reencoded_upper_case():
    token = TS + V2 + HWM + ZERO + FALSE + "14" + END
    data = rt.decode({"_data": token.lower()})
    assert data.to_document() == {"_data": token}


def test_first_value_not_a_timestamp_gives_time_zero():
    # BSONElement::timestamp() of a non-timestamp is Timestamp(0, 0); mongod does not check.
    data = rt.decode({"_data": "3C7800" + V2 + HWM + ZERO + FALSE + "14" + END})
    assert data.cluster_time == Timestamp(0, 0)


def test_extra_fields_in_the_token_document_are_ignored():
    token = TS + V2 + HWM + ZERO + FALSE + "14" + END
    assert rt.decode({"_data": token, "extra": 1}).is_high_water_mark


# -- building tokens: the uasserts of ResumeToken(const ResumeTokenData&) ----------------------

T = Timestamp(100, 1)
IDENT_RAW = rt.make_event_identifier("insert", 2, document_key={"_id": 1})


@pytest.mark.parametrize(
    ("data", "code", "errmsg"),
    [
        (rt.ResumeTokenData(T, 2, rt.HIGH_WATER_MARK_TOKEN, txn_op_index=1), 6189505,
         "Invalid high water mark token"),
        (rt.ResumeTokenData(T, 2, rt.HIGH_WATER_MARK_TOKEN, uuid=b"\x01" * 16), 6189505,
         "Invalid high water mark token"),
        (rt.ResumeTokenData(T, 1, event_identifier=rt.make_event_identifier(
            "insert", 1, document_key={"_id": 1})), 50788,
         "Unexpected resume token with a eventIdentifier but no UUID"),
        (rt.ResumeTokenData(T, 2), 6189502,
         "Expected an eventIdentifier for an event resume token"),
        (rt.ResumeTokenData(T, 1, uuid=b"\x01" * 16, fragment_num=0), 7182504,
         "Tokens of version 1 cannot have a fragmentNum"),
    ],
)
def test_building_invalid_tokens_fails_like_mongod(data, code, errmsg):
    with pytest.raises(MongoError) as err:
        data.to_document()
    assert (err.value.code, err.value.errmsg) == (code, errmsg)


def test_txn_op_index_uses_append_number_types():
    # appendNumber(long long): NumberInt below 2^30, so no type bits for realistic indexes.
    doc = rt.ResumeTokenData(T, 2, txn_op_index=(1 << 30) - 1, uuid=b"\x01" * 16,
                             event_identifier=IDENT_RAW).to_document()
    assert "_typeBits" not in doc
    # At 2^30 mongod would append a double, and its own decoder then refuses the token.
    big = rt.ResumeTokenData(T, 2, txn_op_index=1 << 30, uuid=b"\x01" * 16,
                             event_identifier=IDENT_RAW).to_document()
    assert "_typeBits" in big
    with pytest.raises(MongoError) as err:
        rt.decode(big)
    assert err.value.code == 50855
