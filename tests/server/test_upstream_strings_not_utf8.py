"""Strings that are not UTF-8 through a sidecar (`--upstream`): written through it, read back
from its upstream and streamed from the upstream's oplog byte for byte, as the upstream itself
serves them (tests/embedded/test_strings_not_utf8.py has the single-server cases)."""

from __future__ import annotations

import time

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from tests.embedded.test_strings_not_utf8 import NOT_UTF8, not_utf8_document
from tests.server.test_upstream import GUARD_S, UpstreamServer
from tests.support.embedded_support import EmbeddedServer

RAW = CodecOptions(document_class=RawBSONDocument, unicode_decode_error_handler="surrogateescape")


def test_sidecar_writes_reads_and_streams_them():
    with EmbeddedServer() as a:
        b = UpstreamServer(a.uri, max_await_ms=50)
        try:
            b.wait_ready()
            with b.client() as cb, a.client() as ca:
                via_b = cb.get_database("u8", codec_options=RAW).c
                doc = not_utf8_document(1)
                with via_b.watch(pipeline=[{"$match": {"operationType": {"$ne": "delete"}}}],
                                 full_document="updateLookup", max_await_time_ms=50) as stream:
                    via_b.insert_one(doc)
                    via_b.update_one({"_id": 1}, {"$set": {"n": 1}})
                    events = []
                    deadline = time.monotonic() + GUARD_S
                    while len(events) < 2 and time.monotonic() < deadline:
                        event = stream.try_next()
                        if event is not None:
                            events.append(event)
                on_a = ca.get_database("u8", codec_options=RAW).c.find_one()
                with ca.get_database("u8", codec_options=RAW).c.watch(
                        full_document="updateLookup", start_at_operation_time=events[0][
                            "clusterTime"]) as a_stream:
                    a_events = [a_stream.next(), a_stream.next()]
        finally:
            b.stop()
    assert [e["operationType"] for e in events] == ["insert", "update"]
    assert events[0]["fullDocument"].raw == doc.raw and NOT_UTF8 in on_a.raw
    assert [e.raw for e in events] == [e.raw for e in a_events]  # as A serves them
