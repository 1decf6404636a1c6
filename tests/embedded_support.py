"""An embedded-store server in a background thread, for tests driving it with pymongo.

It lives in `cdcserver.testing` (the pytest plugin users get); this module keeps the old
import path working.
"""

from __future__ import annotations

from cdcserver.testing import EmbeddedServer

__all__ = ["EmbeddedServer"]
