"""An embedded-store server running in a background thread, for tests driving it with pymongo."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import bson
from bson.codec_options import CodecOptions

from cdcserver.context import ServerState
from cdcserver.embedded.store import Store
from cdcserver.server import Server
from cdcserver.sources.embedded import EmbeddedOplog


class EmbeddedServer:
    def __init__(self, data_dir: str | None = None, **store_options: Any) -> None:
        self.store = Store(data_dir, **store_options)
        self.oplog = EmbeddedOplog(self.store, noop_interval_s=0)
        self.state = ServerState(log=self.oplog)
        self.server = Server(self.state)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(
            self.server.start("127.0.0.1", 0), self.loop
        ).result(10)
        self.uri = f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def client(self, **kwargs: Any):
        from pymongo import MongoClient

        return MongoClient(self.uri, serverSelectionTimeoutMS=5000, **kwargs)

    def entries(self) -> list[dict[str, Any]]:
        """Every oplog entry, decoded (UUIDs as Binary, datetimes naive)."""
        opts = CodecOptions()
        return [bson.decode(raw, opts) for raw in self.store.oplog_entries()]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.store.close()

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
