"""Spark's Python daemon (`pyspark.daemon`) with the replay's modules imported before it forks
its workers: each worker starts with them (`spark.python.daemon.module`, set by `session()`),
instead of importing them again when its first task arrives. `pyspark.worker` too (the daemon
imports it in each worker after the fork, 0.1 s each); it starts no thread when imported."""

from __future__ import annotations

import pyarrow.fs  # noqa: F401 - the output's file systems
import pyspark.worker  # noqa: F401
from pyspark import daemon

import cdcserver.spark.output  # noqa: F401
import cdcserver.spark.replay  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
