"""A live replica set (`serve --upstream URI`, a sidecar): its oplog tailed into a retained
log, change streams answered here, every other command forwarded to the upstream. A mongos as
URI is the sharded sidecar instead (`deployments/sidecar.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable

from cdcserver.commands import cursors, proxy
from cdcserver.commands.proxy import ForwardedCursor
from cdcserver.config import Config
from cdcserver.context import CommandTable, Route
from cdcserver.cursors import CursorManager
from cdcserver.deployment import Standalone
from cdcserver.deployments.embedded import EMBEDDED
from cdcserver.embedded.store import Store
from cdcserver.materialize import snapshot
from cdcserver.materialize.sync import Materializer
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
from pipeline_stages.lookups import ExternalImages

log = logging.getLogger(__name__)

UPSTREAM = CommandTable(
    "upstream",
    {
        **{name: EMBEDDED[name] for name in sorted(proxy.LOCAL_COMMANDS)},
        **{name: Route(choose) for name, choose in proxy.ROUTES.items()},
        # Snapshot reads of materialized namespaces read the copy (materialize/snapshot.py);
        # every other find / aggregate is routed as before.
        "find": Route(snapshot.route_find),
        "aggregate": Route(snapshot.route_aggregate),
        "distinct": Route(snapshot.route_distinct),
        # Every cursor's: a change stream here, a forwarded one at the member holding it.
        "getMore": cursors.get_more,
        "killCursors": cursors.kill_cursors,
    },
    default=proxy.forward_command,  # everything else runs on the upstream
    forwarding=proxy.FORWARDING,
    known=EMBEDDED,
)


class UpstreamDeployment(Standalone):
    """The upstream's tail; images are looked up on the upstream."""

    commands: CommandTable = UPSTREAM
    store: Store | None = None

    def __init__(
        self, oplog: UpstreamOplog, *, follow: bool = True,
        materialize: list[str] | None = None,
    ) -> None:
        self.oplog = oplog
        self.follow = follow
        # `[upstream] materialize`: the copy next to the retained log (its images answer first).
        self.materializer: Materializer | None = None
        if materialize:
            retain_dir = oplog.options.retain_dir
            if not retain_dir:
                raise ValueError("materialize needs the retained log (upstream.retain_dir)")
            self.materializer = Materializer(oplog, materialize, os.fspath(retain_dir))
            oplog.images.copy = self.materializer

    @property
    def images(self) -> ExternalImages:
        return self.oplog.images

    @property
    def tailer(self) -> Callable[[], Awaitable[None]]:
        if self.materializer is None:
            return self.oplog.follow
        return self._follow_and_materialize

    async def _follow_and_materialize(self) -> None:
        """The tail and, beside it, the copy's apply loop (stopped with it)."""
        assert self.materializer is not None
        task = asyncio.create_task(self.materializer.run())
        try:
            await self.oplog.follow()
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    def cursor_elsewhere(
        self, registry: CursorManager
    ) -> Callable[[int, str], ForwardedCursor]:
        """A cursor id not held here may still be open on the upstream (reaped here, not
        there): its getMore and killCursors go to the upstream, which answers for it."""
        return lambda cursor_id, ns: ForwardedCursor(cursor_id, ns, None, self.oplog, registry)


def upstream_options(config: Config) -> UpstreamOptions:
    """`[upstream]` as the tail's options."""
    fields = {f.name for f in dataclasses.fields(UpstreamOptions)}
    values = {k: getattr(config.upstream, k) for k in fields if hasattr(config.upstream, k)}
    return UpstreamOptions(**values)


def open_upstream(config: Config) -> UpstreamDeployment:
    """`serve --upstream URI` of a replica set: its tail, primed so that the first streams can
    start at once (raises DataDirError for an unusable `upstream.retain_dir`)."""
    log.info("connecting to upstream %s", config.upstream.uri.split("@")[-1])  # no credentials
    source = UpstreamOplog(upstream_options(config))
    source.prime()
    return UpstreamDeployment(source, materialize=list(config.upstream.materialize))
