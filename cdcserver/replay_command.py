"""The `$changeStream` aggregate that `cdcserver replay` and `spark-replay` run, from their
common flags (--ns/--db/--cluster, --options, --pipeline)."""

from __future__ import annotations

import argparse
from typing import Any

from bson import json_util


def spec_command(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(aggregate command, db); ValueError with the one-line message for bad flags."""
    try:
        options = json_util.loads(args.options) if args.options else {}
        stages = json_util.loads(args.pipeline) if args.pipeline else []
    except ValueError as exc:
        raise ValueError(f"--options/--pipeline: invalid JSON ({exc})") from None
    if not isinstance(options, dict) or not isinstance(stages, list):
        raise ValueError("--options takes a JSON object and --pipeline a JSON array")
    if args.cluster:
        options = {**options, "allChangesForCluster": True}
        return {"aggregate": 1, "pipeline": [{"$changeStream": options}, *stages]}, "admin"
    if args.db:
        return {"aggregate": 1, "pipeline": [{"$changeStream": options}, *stages]}, args.db
    db, _, coll = args.ns.partition(".")
    if not coll:
        raise ValueError("--ns takes DB.COLL")
    return {"aggregate": coll, "pipeline": [{"$changeStream": options}, *stages]}, db
