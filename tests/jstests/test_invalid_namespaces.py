"""Translated from mongodb/mongo `jstests/change_streams/invalid_namespaces.js` @
05ec08fa62771582fb3f45160fff2e0ff184d6d9: no change stream on the admin, config and local
databases or on `system.` collections; names merely containing "system" are fine."""

from __future__ import annotations

from typing import Any

from cst import assert_invalid_change_stream_nss, assert_valid_change_stream_nss


def test_invalid_namespaces(client: Any) -> None:
    for db_name in ("admin", "config", "local"):
        assert_invalid_change_stream_nss(client, db_name)
    for coll in ("system.users", "system.profile", "system.version"):
        assert_invalid_change_stream_nss(client, "test", coll)
    for coll in ("systemindexes", "system_users"):
        assert_valid_change_stream_nss(client, "test", coll)
