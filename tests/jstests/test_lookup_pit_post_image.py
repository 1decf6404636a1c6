"""Translated from mongodb/mongo `jstests/change_streams/lookup_pit_post_image.js` @
2d76701ca6266cf01bfc43e96c9a8ad912debb4f: `fullDocument` whenAvailable and required are
accepted (8.0 always has point-in-time images, so the jstest's feature-flag-off branch, which
expects BadValue, does not run)."""

from __future__ import annotations

from typing import Any


def test_lookup_pit_post_image(client: Any) -> None:
    db = client["lookup_pit_post_image"]
    db.drop_collection("test")
    db.create_collection("test")
    for mode in ("whenAvailable", "required"):
        stream = db["test"].watch([], full_document=mode)  # does not throw
        stream.close()
