"""One module per serving mode, each with its `Deployment` and its command table (the table
next to the mode it serves); `cdcserver/deployment.py` says what a deployment is.

`for_oplog` is the plain case: the deployment that serves an oplog source as it is (a recorded
oplog, the embedded store's own, a live replica set's), as `cdcserver.testing` is given one.
"""

from __future__ import annotations

from cdcserver.deployment import Deployment
from cdcserver.sources.base import OplogLog
from cdcserver.sources.embedded import EmbeddedOplog
from cdcserver.sources.mongo import UpstreamOplog


def for_oplog(oplog: OplogLog, *, follow: bool = False) -> Deployment:
    """The deployment serving `oplog`: the embedded mode for the store's own oplog, the
    upstream mode for a live replica set's, else a recorded oplog (`follow`: tail it)."""
    if isinstance(oplog, EmbeddedOplog):
        from cdcserver.deployments.embedded import EmbeddedDeployment

        return EmbeddedDeployment(oplog.store, oplog, follow=follow)
    if isinstance(oplog, UpstreamOplog):
        from cdcserver.deployments.upstream import UpstreamDeployment

        return UpstreamDeployment(oplog, follow=follow)
    from cdcserver.deployments.recorded import RecordedDeployment

    return RecordedDeployment(oplog, follow=follow)
