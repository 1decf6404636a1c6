"""What `fast_path.py` and `lookups.py` read of a `ChangeStreamPipeline`: its spec and stages.

pipeline.py imports both of them (it runs their code on each push), so they take the pipeline
as this Protocol instead of importing pipeline.py back. `ChangeStreamPipeline` matches it as it
is (mypy checks that where pipeline.py passes itself).
"""

from __future__ import annotations

from typing import Protocol

from pipeline_stages.add_post_image import AddPostImage
from pipeline_stages.add_pre_image import AddPreImage
from pipeline_stages.oplog_match import OplogFilter
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.split_large_event import SplitLargeEvent
from pipeline_stages.transform import ChangeStreamTransform
from pipeline_stages.user_stages import UserStages


class StageChain(Protocol):
    """A change stream's stage chain as the fast path and the lookups see it (read-only)."""

    @property
    def spec(self) -> ChangeStreamSpec: ...

    @property
    def filter(self) -> OplogFilter: ...

    @property
    def transform(self) -> ChangeStreamTransform: ...

    @property
    def add_pre_image(self) -> AddPreImage | None: ...

    @property
    def add_post_image(self) -> AddPostImage | None: ...

    @property
    def match_before_pre(self) -> UserStages | None:
        """The user's leading $match, run ahead of both image stages (None: it is not)."""
        ...

    @property
    def split(self) -> SplitLargeEvent | None: ...

    @property
    def images(self) -> object:
        """The image source given to the pipeline (an `ImageSource`, a
        `lookups.ExternalImages`, or None); the lookups only ask whether it is external."""
        ...

    @property
    def fast_ns(self) -> dict[str, bytes | None]:
        """The fast path's cache of encoded `ns` elements, kept per stream (fast_path.py)."""
        ...
