"""The `$changeStream` aggregate that `cdcserver replay` and `spark-replay` run, from their
common flags (--ns/--db/--cluster, --options, --pipeline)."""

from __future__ import annotations

import argparse
from typing import Any


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `spec_command` reads: the stream's scope, --pipeline and --options."""
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--ns", help="DB.COLL: a collection stream")
    scope.add_argument("--db", help="DB: a database stream")
    scope.add_argument("--cluster", action="store_true", help="a whole-cluster stream")
    parser.add_argument("--pipeline", help="stages after $changeStream, as a JSON array")
    parser.add_argument("--options", help="$changeStream options, as a JSON object")


def spec_command(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(aggregate command, db); ValueError with the one-line message for bad flags."""
    from bson import json_util  # here: `cdcserver --help` builds the parsers, nothing more

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
