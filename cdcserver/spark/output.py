"""Where `spark-replay` writes: part files written by the Python tasks themselves, committed by
the driver.

The events never pass through the JVM (no Arrow transfer, no JVM writer, no SQL plan): on a
machine with few cores the JVM's work (its writer, and compiling the code paths of that
writer) competed with the Python workers, so `local[2]` was far from twice `local[1]`.

The protocol is Hadoop's `FileOutputCommitter` (v1), done here:

1. **setup** (driver): with `errorifexists`, an existing `out` is refused; `out/_temporary/<job>/`
   is created.
2. **task**: each attempt writes `_temporary/<job>/<partition>-<attempt>-<random>` and returns
   its name with its counts. A failed attempt's file stays where it is, unused.
3. **commit** (driver), once every task succeeded: Spark gives the driver the result of one
   successful attempt per partition; only those files are used. With `overwrite`, what `out`
   held before is removed now (not before the job: a failed job leaves it as it was); each
   file is renamed to `part-NNNNN-<job>-c000.<ext>` (Spark's names: `.txt` for JSON lines,
   `.snappy.parquet`), in partition order; `_temporary` is removed and `_SUCCESS` written.
4. **abort**: `_temporary/<job>` is removed, and `out` when the job created it.

Renames are atomic on local and HDFS file systems; on object stores (`s3://`, `gs://`) a rename
is a copy, as with Spark's own committer there. Paths: local, or any URI pyarrow's file systems
open.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

from cdcserver.spark import splits as sp

TEMPORARY = "_temporary"
SUCCESS = "_SUCCESS"


def filesystem(path: str) -> tuple[Any, str]:
    """(pyarrow file system, path within it) of a local path or a URI."""
    from pyarrow import fs

    if sp.is_local(path):
        return fs.LocalFileSystem(), os.path.abspath(path)
    filesystem, inner = fs.FileSystem.from_uri(path)
    return filesystem, inner


def suffix(fmt: str) -> str:
    return ".txt" if fmt == "jsonl" else ".snappy.parquet"


@dataclass(frozen=True, slots=True)
class TaskOutput:
    """What a task attempt wrote: its file (None: no events), entries read, events written,
    CPU seconds, and the pipeline's error if it failed."""

    partition: int
    name: str | None
    entries: int
    events: int
    cpu: float = 0.0  # the attempt's CPU seconds (its Python's process time)
    error: tuple[int, str] | None = None  # the pipeline's (code, errmsg): it wrote nothing
    span: tuple[float, float] = (0.0, 0.0)  # when the attempt started and ended (time.time())


class Output:
    """The driver's side of the protocol (setup, commit, abort) for one job."""

    def __init__(self, out: str, mode: str, fmt: str) -> None:
        if mode not in ("errorifexists", "overwrite"):
            raise ValueError(f"mode must be errorifexists or overwrite, not {mode!r}")
        self.out = out
        self.mode = mode
        self.fmt = fmt
        self.job = uuid.uuid4().hex
        self.fs, self.root = filesystem(out)
        self.staging = f"{self.root}/{TEMPORARY}/{self.job}"
        self.created = False

    def _exists(self, path: str) -> bool:
        from pyarrow import fs

        exists: bool = self.fs.get_file_info(path).type != fs.FileType.NotFound
        return exists

    def setup(self) -> None:
        """Refuse an existing output (errorifexists), create the staging directory."""
        if self._exists(self.root):
            if self.mode != "overwrite":
                raise FileExistsError(
                    f"--out {self.out} exists: give --mode overwrite to replace it"
                )
        else:
            self.created = True
        self.fs.create_dir(self.staging, recursive=True)

    def commit(self, results: list[TaskOutput]) -> list[str]:
        """Make the chosen attempts' files the output; the part files' names, in order."""
        from pyarrow import fs

        if self.mode == "overwrite":
            selector = fs.FileSelector(self.root, recursive=False)
            for info in self.fs.get_file_info(selector):
                if info.base_name == TEMPORARY:
                    continue
                if info.type == fs.FileType.Directory:
                    self.fs.delete_dir(info.path)
                else:
                    self.fs.delete_file(info.path)
        names = []
        ext = suffix(self.fmt)
        for result in sorted(results, key=lambda r: r.partition):
            if result.name is None:
                continue
            name = f"part-{result.partition:05d}-{self.job}-c000{ext}"
            self.fs.move(f"{self.staging}/{result.name}", f"{self.root}/{name}")
            names.append(name)
        if not names and self.fmt == "parquet":
            # No events: one file with the schema, so that the output reads as a table.
            name = f"part-00000-{self.job}-c000{ext}"
            write_empty_parquet(self.fs, f"{self.root}/{name}")
            names.append(name)
        self._remove_staging()
        with self.fs.open_output_stream(f"{self.root}/{SUCCESS}"):
            pass
        return names

    def abort(self) -> None:
        """Remove what the job wrote (and `out` if the job created it)."""
        try:
            if self.created:
                self.fs.delete_dir(self.root)
            else:
                self._remove_staging()
        except OSError:
            pass  # nothing there, or nothing we may delete

    def _remove_staging(self) -> None:
        from pyarrow import fs

        parent = f"{self.root}/{TEMPORARY}"
        self.fs.delete_dir(self.staging)
        try:
            if not self.fs.get_file_info(fs.FileSelector(parent)):
                self.fs.delete_dir(parent)  # no other job's staging left in it
        except OSError:
            pass


def write_empty_parquet(filesystem_: Any, path: str) -> None:
    import pyarrow.parquet as pq

    from cdcserver.spark.rows import arrow_schema

    with filesystem_.open_output_stream(path) as sink:
        pq.ParquetWriter(sink, arrow_schema("parquet"), compression="snappy").close()


class PartWriter:
    """A task attempt's file in the staging directory: JSON lines (bytes) or Parquet (Arrow
    record batches, buffered into row groups of about `row_group_bytes`)."""

    def __init__(
        self, out: str, job: str, partition: int, attempt: int, fmt: str,
        row_group_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.fs, root = filesystem(out)
        self.name = f"{partition:05d}-{attempt}-{uuid.uuid4().hex[:12]}"
        self.path = f"{root}/{TEMPORARY}/{job}/{self.name}"
        self.fmt = fmt
        self.row_group_bytes = row_group_bytes
        self._sink: Any = None
        self._parquet: Any = None
        self._pending: list[Any] = []
        self._pending_bytes = 0

    def _open(self) -> None:
        self._sink = self.fs.open_output_stream(self.path)
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            from cdcserver.spark.rows import arrow_schema

            self._parquet = pq.ParquetWriter(
                self._sink, arrow_schema("parquet"), compression="snappy"
            )

    def write_lines(self, data: bytes) -> None:
        if self._sink is None:
            self._open()
        self._sink.write(data)

    def write_batch(self, batch: Any) -> None:
        if self._sink is None:
            self._open()
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= self.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._pending:
            self._parquet.write_table(pa.Table.from_batches(self._pending))
            self._pending, self._pending_bytes = [], 0

    def close(self) -> str | None:
        """The file's name, or None when nothing was written (no file)."""
        if self._sink is None:
            return None
        if self._parquet is not None:
            self._flush()
            self._parquet.close()
        self._sink.close()
        return self.name

    def discard(self) -> None:
        """A failed attempt: close and remove what it wrote."""
        try:
            if self._sink is not None:
                self._sink.close()
                self.fs.delete_file(self.path)
        except Exception:  # noqa: BLE001 - the staging directory goes with the job anyway
            pass
