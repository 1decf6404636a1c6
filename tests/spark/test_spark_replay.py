"""`cdcserver spark-replay` against `cdcserver replay`: the same events, tokens, bytes and order.

* The split reader without Spark: from any byte offset, a range finds the next entry (BSON) or
  line (JSON lines) itself; the ranges of a file together give every entry exactly once.
* On Spark (`local[2]`, marked `spark`): every real oplog of the corpus and generated mongod-8.0
  oplogs (multi-entry and prepared transactions spanning ranges, DDL that invalidates, resume
  options, user stages), cut into small ranges so that every job has several partitions; three
  shards merged by token: 30k entries, or over a million with CDCSERVER_SPARK_MILLION=1.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
import re
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import bson
import pytest
from bson import json_util
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.cli import replay_events, replay_shards
from cdcserver.sources.file import OplogFileError
from cdcserver.spark import splits as sp
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import decode_entry
from tests.support.oplog_builders import Oplog, make_lsid

CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
TOOLS = pathlib.Path("corpus/oplog/mongodb-mongo-tools")
DERIVED = pathlib.Path("corpus/oplog/derived-jsonl/mongodb-mongo-tools")
_SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared"


def _corpus(root: pathlib.Path, pattern: str) -> list[str]:
    base = _SHARED / root
    if not base.is_dir():
        return ["(corpus missing)"]
    return sorted(str(p.relative_to(_SHARED)) for p in base.rglob(pattern))


# -- generated oplogs ---------------------------------------------------------------------------


def _encode(entry: Any) -> bytes:
    return entry.raw if isinstance(entry, RawBSONDocument) else bson.encode(entry)


class Workload:
    """A random mongod-8.0 oplog: CRUD on a few collections, multi-entry transactions whose
    links interleave with other writes over hundreds of entries, prepared transactions
    (committed or aborted later), retryable writes, batched applyOps, no-ops, indexes."""

    COLLS = ("shop.orders", "shop.items", "app.users")

    def __init__(self, seed: int = 1, shard: int = 0, start: Timestamp | None = None) -> None:
        self.rng = random.Random(seed)
        self.oplog = Oplog(start or Timestamp(1_720_000_000, 1))
        self.next_id = shard * 1_000_000_000
        self.live: dict[str, list[int]] = {c: [] for c in self.COLLS}
        self.open: list[list[Any]] = []  # [txn, links left, prepared?]
        self.prepared: list[Any] = []
        self.sessions = 0
        self.pad = "p" * 120

    def _doc(self) -> dict[str, Any]:
        self.next_id += 1
        return {"_id": self.next_id, "n": self.next_id % 97, "s": self.pad[: self.next_id % 121]}

    def _inner(self) -> dict[str, Any]:
        coll = self.rng.choice(self.COLLS)
        live = self.live[coll]
        if live and self.rng.random() < 0.3:
            return self.oplog.op_update(coll, self.rng.choice(live), {"u": {"n": 1}})
        doc = self._doc()
        live.append(doc["_id"])
        return self.oplog.op_insert(coll, doc)

    def step(self) -> None:
        rng, oplog = self.rng, self.oplog
        r = rng.random()
        coll = rng.choice(self.COLLS)
        live = self.live[coll]
        if r < 0.34 or not live:
            doc = self._doc()
            live.append(doc["_id"])
            oplog.insert(coll, doc)
        elif r < 0.52:
            oplog.update(coll, rng.choice(live), {"u": {"n": rng.randrange(100)}, "i": {"x": 1}})
        elif r < 0.56:
            oplog.replace(coll, {"_id": rng.choice(live), "replaced": True})
        elif r < 0.62:
            oplog.delete(coll, live.pop(rng.randrange(len(live))))
        elif r < 0.70:
            self.sessions += 1
            txn = oplog.transaction(make_lsid(self.sessions % 200), self.sessions)
            links = rng.choice((1, 1, 2, 3, 5))
            prepared = rng.random() < 0.3
            self.open.append([txn, links, prepared])
            self._advance(len(self.open) - 1)
        elif r < 0.84 and self.open:
            self._advance(rng.randrange(len(self.open)))
        elif r < 0.86 and self.prepared:
            txn = self.prepared.pop(rng.randrange(len(self.prepared)))
            if rng.random() < 0.8:
                txn.commit_prepared()
            else:
                txn.abort()
        elif r < 0.88:
            self.sessions += 1
            doc = self._doc()
            live.append(doc["_id"])
            oplog.insert(coll, doc, retryable={"lsid": make_lsid(7), "txnNumber": self.sessions})
        elif r < 0.89:
            self.sessions += 1
            ops = [self._inner() for _ in range(rng.randrange(1, 4))]
            oplog.apply_ops(ops, retryable={"lsid": make_lsid(9), "txnNumber": self.sessions})
        elif r < 0.895:
            oplog.create_indexes(coll, {"n": 1}, f"n_{len(oplog.entries)}")
        else:
            oplog.noop()

    def _advance(self, i: int) -> None:
        txn, links, prepared = self.open[i]
        ops = [self._inner() for _ in range(self.rng.randrange(1, 4))]
        if links > 1:
            txn.partial(ops)
            self.open[i][1] = links - 1
            return
        del self.open[i]
        if prepared:
            txn.prepare(ops)
            self.prepared.append(txn)
        else:
            txn.commit(ops)

    def write(self, path: pathlib.Path, n: int, extra: Any = None) -> pathlib.Path:
        """`n` entries (then whatever `extra(oplog)` adds) as BSON or JSON lines."""
        as_json = path.suffix == ".jsonl"
        written = 0
        with open(path, "wb") as f:

            def flush() -> None:
                nonlocal written
                for entry in self.oplog.entries:
                    if as_json:
                        doc = bson.decode(_encode(entry))
                        f.write(json_util.dumps(doc, json_options=CANONICAL).encode() + b"\n")
                    else:
                        f.write(_encode(entry))
                written += len(self.oplog.entries)
                self.oplog.entries.clear()

            while written + len(self.oplog.entries) < n:
                self.step()
                if len(self.oplog.entries) >= 4096:
                    flush()
            if extra is not None:
                extra(self.oplog)
            flush()
        return path


def ddl_story(oplog: Oplog) -> None:
    """Writes around DDL that ends collection and database streams, with transactions open
    across it: drop and re-create shop.orders, rename it away, then drop the database."""
    rng = random.Random(5)
    txn = oplog.transaction(make_lsid(501), 1)
    txn.partial([oplog.op_insert("shop.orders", {"_id": "t1"})])
    for i in range(30):
        oplog.insert("shop.orders", {"_id": f"a{i}"})
    txn.partial([oplog.op_insert("shop.items", {"_id": "t2"})])
    oplog.drop("shop.orders", num_records=30)
    txn.commit([oplog.op_insert("shop.orders", {"_id": "t3"})])
    for i in range(20):
        oplog.insert("shop.orders", {"_id": f"b{i}", "r": rng.random()})
    oplog.rename("shop.orders", "shop.archive")
    for i in range(20):
        oplog.insert("shop.items", {"_id": f"c{i}"})
    oplog.drop_database("shop")
    for i in range(20):
        oplog.insert("app.users", {"_id": f"d{i}"})


# -- the reference ------------------------------------------------------------------------------


def command(scope: str, options: dict[str, Any] | None = None, stages: Sequence[Any] = ()):
    """(aggregate command, db) as `cdcserver replay --ns/--db/--cluster` builds it."""
    options = dict(options or {})
    if scope == "cluster":
        options["allChangesForCluster"] = True
        return {"aggregate": 1, "pipeline": [{"$changeStream": options}, *stages]}, "admin"
    db, _, coll = scope.partition(".")
    target: Any = coll if coll else 1
    return {"aggregate": target, "pipeline": [{"$changeStream": options}, *stages]}, db


def reference(paths: Sequence[str], cmd: dict[str, Any], db: str) -> list[RawBSONDocument]:
    return [e for batch, _ in replay_events([str(p) for p in paths], cmd, db) for e in batch]


def reference_error(paths: Sequence[str], cmd: dict[str, Any], db: str) -> str | None:
    """What `cdcserver replay` prints after "cdcserver replay: " when it fails."""
    try:
        reference(paths, cmd, db)
    except OplogFileError as exc:
        return str(exc)
    except MongoError as exc:
        return f"{exc.code} {exc.code_name}: {exc.errmsg}"
    return None


def merged_reference(
    shards: Sequence[Sequence[str]], cmd: dict[str, Any], db: str
) -> Iterator[RawBSONDocument]:
    """`cdcserver replay` of several shards: their streams merged by `pipeline_stages/merge.py`
    (tests/pipeline_stages/test_merge.py checks it against a stable merge by token)."""
    for batch, _ in replay_shards([[str(p) for p in paths] for paths in shards], cmd, db):
        yield from batch


# -- Spark --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    from cdcserver.spark.replay import session

    spark = session(
        "local[2]",
        "cdcserver tests",
        **{
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.memory": "3g",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    # py4j logs its connections' closing at exit, after pytest has closed the captured stderr.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return spark


def spark_replay(spark, shards, cmd, db, out: pathlib.Path, *, split_size: int, fmt="parquet"):
    from cdcserver.spark.replay import SparkReplay

    job = SparkReplay(
        [[str(p) for p in paths] for paths in shards], cmd, db, str(out), fmt=fmt,
        split_size=split_size, mode="overwrite",
    )
    return job.run(spark)


def spark_error(spark, shards, cmd, db, out: pathlib.Path, *, split_size: int) -> str | None:
    from cdcserver.spark.replay import ReplayError

    try:
        spark_replay(spark, shards, cmd, db, out, split_size=split_size)
    except ReplayError as exc:
        return str(exc)
    return None


def parts(out: pathlib.Path, suffix: str) -> list[pathlib.Path]:
    return sorted(p for p in out.iterdir() if p.name.startswith("part-") and p.suffix == suffix)


def read_events(out: pathlib.Path) -> Iterator[dict[str, Any]]:
    """The rows of a Parquet output, in order (part files in name order)."""
    import pyarrow.parquet as pq

    for path in parts(out, ".parquet"):
        table = pq.read_table(path)
        yield from table.to_pylist()


def check_rows(rows: list[dict[str, Any]], expected: Sequence[RawBSONDocument]) -> None:
    """Event for event: bytes, token, Extended JSON and the other columns."""
    assert len(rows) == len(expected)
    for row, event in zip(rows, expected):
        assert row["event"] == event.raw
        assert row["_id"] == event["_id"]["_data"]
        assert row["eventJson"] == json_util.dumps(event, json_options=CANONICAL)
        assert row["operationType"] == event["operationType"]
        ns = event.get("ns") or {}
        assert (row["db"], row["coll"]) == (ns.get("db"), ns.get("coll"))
        key = event.get("documentKey")
        assert row["documentKey"] == (
            None if key is None else json_util.dumps(key, json_options=CANONICAL)
        )
        ts = event["clusterTime"]
        assert row["clusterTime"] == {"t": ts.time, "i": ts.inc}
    tokens = [row["_id"] for row in rows]
    assert tokens == sorted(tokens)


def assert_same(spark, paths, cmd, db, tmp_path, *, split_size: int, fmt="parquet") -> int:
    """spark-replay == cdcserver replay; returns the number of events."""
    expected = reference(paths, cmd, db)
    out = tmp_path / f"out-{fmt}"
    summary = spark_replay(spark, [paths], cmd, db, out, split_size=split_size, fmt=fmt)
    assert summary.splits > 1 or os.path.getsize(paths[0]) <= split_size
    assert summary.events == len(expected)
    if fmt == "jsonl":
        text = b"".join(p.read_bytes() for p in parts(out, ".txt"))
        lines = "".join(json_util.dumps(e, json_options=CANONICAL) + "\n" for e in expected)
        assert text.decode() == lines
    else:
        check_rows(list(read_events(out)), expected)
    return len(expected)


# -- the split reader (no Spark) ----------------------------------------------------------------


def _entries_file(tmp_path: pathlib.Path, suffix: str, n: int = 300) -> pathlib.Path:
    work = Workload(seed=3)

    def tricky(oplog: Oplog) -> None:
        # An insert whose document is itself an oplog entry (as the last field, and not),
        # and a large one: embedded entries must not be taken for entry starts.
        inner = bson.decode(bson.encode(dict(oplog.entries[-1]))) if oplog.entries else {}
        oplog.insert("shop.orders", {"_id": "e1", "entry": inner})
        oplog.insert("shop.orders", {"_id": "e2", "entry": inner, "after": 1})
        oplog.insert("shop.orders", {"_id": "big", "blob": bson.Binary(os.urandom(70_000))})
        oplog.insert("shop.orders", {"_id": "last"})

    return work.write(tmp_path / f"oplog{suffix}", n, extra=tricky)


def _true_starts(path: pathlib.Path) -> list[int]:
    data = path.read_bytes()
    if path.suffix == ".jsonl":
        return [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A and i + 1 < len(data)]
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += int.from_bytes(data[pos : pos + 4], "little")
    return out


@pytest.mark.parametrize("suffix", [".bson", ".jsonl"])
def test_a_range_finds_the_next_entry_from_any_offset(tmp_path, suffix):
    path = _entries_file(tmp_path, suffix)
    starts = _true_starts(path)
    size = path.stat().st_size
    rng = random.Random(1)
    offsets = sorted(set(range(0, 4000)) | {rng.randrange(size) for _ in range(3000)})
    with sp.Input(str(path)) as src:
        find = sp.find_json_start if suffix == ".jsonl" else sp.find_bson_start
        for offset in offsets:
            i = next((k for k, s in enumerate(starts) if s >= offset), None)
            expected = None if i is None else starts[i]
            assert find(src, offset, size) == expected, offset


@pytest.mark.parametrize("suffix", [".bson", ".jsonl"])
@pytest.mark.parametrize("split_size", [1, 97, 1000, 50_000, 10**9])
def test_ranges_give_every_entry_once(tmp_path, suffix, split_size):
    path = _entries_file(tmp_path, suffix, n=120)
    size = path.stat().st_size
    expected = [e["ts"] for e in (decode_entry(r) for r in _raw_entries(path))]
    got, stops = [], []
    with sp.Input(str(path)) as src:
        for split in sp.plan_splits(0, 0, str(path), size, suffix == ".jsonl", split_size):
            find = sp.find_json_start if split.is_json else sp.find_bson_start
            first = find(src, split.start, split.end)
            if first is None:
                continue
            assert not stops or stops[-1] == first  # each range starts where the last stopped
            stats: dict[str, int] = {}
            got += [entry["ts"] for _, _, _, entry in sp.iter_split(src, split, first, None, stats)]
            stops.append(stats["stop"])
    assert got == expected
    assert stops[-1] == size


@pytest.mark.parametrize("tasks", [1, 2, 3, 8, 100])
@pytest.mark.parametrize("sizes", [[10], [64, 64, 64, 20], [64] * 18, [5, 64, 64, 64, 1, 64, 64]])
def test_scan_groups_keep_every_range_once_in_order(tasks, sizes):
    """Scan tasks take runs of consecutive ranges (several files of a shard, several shards),
    at most `tasks` of them, none empty, about equal in bytes."""
    from cdcserver.spark.replay import scan_groups

    splits = []
    for f, size in enumerate(sizes):  # one file per size, cut in ranges of 16 bytes
        splits += sp.plan_splits(f % 2, f, f"f{f}", size, False, 16)
    groups = scan_groups(splits, tasks)
    assert [s for g in groups for s in g] == splits
    assert 1 <= len(groups) <= min(tasks, len(splits)) and all(groups)
    share = sum(s.end - s.start for s in splits) / len(groups)
    for g in groups:  # within one range of the equal share
        assert abs(sum(s.end - s.start for s in g) - share) <= 16
    if tasks <= len(splits) and all(s.end - s.start == 16 for s in splits):
        assert len(groups) == tasks


def _raw_entries(path: pathlib.Path) -> list[bytes]:
    data = path.read_bytes()
    if path.suffix == ".jsonl":
        lines = [ln for ln in data.splitlines() if ln.strip()]
        return [bson.encode(json_util.loads(ln, json_options=CANONICAL)) for ln in lines]
    starts = _true_starts(path) + [len(data)]
    return [data[a:b] for a, b in zip(starts, starts[1:])]


def test_corrupt_bson_is_reported_as_replay_reports_it(tmp_path):
    path = Workload(seed=2).write(tmp_path / "oplog.bson", 50)
    data = bytearray(path.read_bytes())
    starts = _true_starts(path)
    bad = tmp_path / "bad.bson"
    bad.write_bytes(bytes(data[: starts[20]]) + b"\xff\xff\xff\x7f" + bytes(data[starts[20] + 4 :]))
    with pytest.raises(OplogFileError) as ref:
        reference([bad], *command("cluster"))
    with sp.Input(str(bad)) as src:
        split = sp.plan_splits(0, 0, str(bad), len(data), False, 10**9)[0]
        with pytest.raises(sp.SplitError) as ours:
            list(sp.iter_split(src, split, 0))
    assert ours.value.message == str(ref.value)


# -- on Spark -----------------------------------------------------------------------------------


def _check_corpus_file(spark, path: pathlib.Path, out: pathlib.Path, both: bool) -> None:
    size = path.stat().st_size
    split_size = max(256, size // 3)  # several ranges, at most 4 tasks
    cmd, db = command("cluster", {"showExpandedEvents": True})
    error = reference_error([path], cmd, db)
    if error is not None:  # collection dumps, files going back in time: the same message
        assert spark_error(spark, [[path]], cmd, db, out / "e", split_size=split_size) == error
        return
    events = reference([path], cmd, db)
    fmt = "jsonl" if path.suffix == ".jsonl" else "parquet"
    assert_same(spark, [path], cmd, db, out, split_size=split_size, fmt=fmt)
    # A collection stream on the busiest namespace (invalidation, filtering).
    colls = [f"{e['ns']['db']}.{e['ns']['coll']}" for e in events if "coll" in e.get("ns", {})]
    if both and len(colls) >= 3:
        cmd, db = command(max(set(colls), key=colls.count))
        assert_same(spark, [path], cmd, db, out / "ns", split_size=split_size)


@pytest.mark.spark
@pytest.mark.parametrize("name", _corpus(TOOLS, "*.bson"))
def test_corpus_oplogs_give_the_same_events(spark, shared_dir, tmp_path, name):
    path = shared_dir / name
    if not path.is_file():
        pytest.skip("corpus missing")
    _check_corpus_file(spark, path, tmp_path, both=True)


@pytest.mark.spark
def test_corpus_json_lines_give_the_same_lines(spark, shared_dir, tmp_path):
    """The Extended JSON lines derived from the corpus (jobs run side by side: they are small)."""
    from concurrent.futures import ThreadPoolExecutor

    paths = sorted((shared_dir / DERIVED).rglob("*.jsonl"))
    if not paths:
        pytest.skip("corpus missing")
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(_check_corpus_file, spark, path, tmp_path / str(i), False)
            for i, path in enumerate(paths)
        ]
        for future in futures:
            future.result()


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, pathlib.Path]:
    """An 8k-entry oplog ending in the DDL story, as BSON and as JSON lines (~2 MB)."""
    root = tmp_path_factory.mktemp("generated")
    return {
        suffix: Workload(seed=11).write(root / f"oplog{suffix}", 8_000, extra=ddl_story)
        for suffix in (".bson", ".jsonl")
    }


SPLIT = 512 * 1024  # 4-5 ranges of the generated oplog

CASES = {
    "cluster": ("cluster", {}, []),
    "cluster-expanded": ("cluster", {"showExpandedEvents": True}, []),
    "db": ("shop", {}, []),  # ends at dropDatabase
    "collection": ("shop.orders", {}, []),  # ends at the drop
    "collection-match": ("shop.orders", {}, [{"$match": {"operationType": "update"}}]),
    "collection-lookup": ("shop.items", {"fullDocument": "updateLookup"}, []),
    "db-project": (
        "app", {}, [{"$match": {"fullDocument.n": {"$lt": 20}}}, {"$project": {"ns": 0}}],
    ),
}


@pytest.mark.spark
@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_oplog_gives_the_same_events(spark, generated, tmp_path, case):
    scope, options, stages = CASES[case]
    cmd, db = command(scope, options, stages)
    n = assert_same(spark, [generated[".bson"]], cmd, db, tmp_path, split_size=SPLIT)
    assert n > 0


@pytest.mark.spark
def test_json_lines_give_the_same_lines(spark, generated, tmp_path):
    cmd, db = command("cluster")
    assert_same(spark, [generated[".jsonl"]], cmd, db, tmp_path, split_size=SPLIT, fmt="jsonl")


def _tokens(path: pathlib.Path, scope: str) -> list[RawBSONDocument]:
    return reference([path], *command(scope))


@pytest.mark.spark
def test_resume_options_give_the_same_events(spark, generated, tmp_path):
    path = generated[".bson"]
    events = _tokens(path, "cluster")
    middle = events[len(events) // 2]
    in_txn = next(e for e in events[len(events) // 3 :] if "txnNumber" in e)
    cases = [
        ("cluster", {"resumeAfter": middle["_id"]}),
        ("cluster", {"startAfter": in_txn["_id"]}),
        ("cluster", {"startAtOperationTime": middle["clusterTime"]}),
    ]
    orders = _tokens(path, "shop.orders")
    invalidate = orders[-1]
    assert invalidate["operationType"] == "invalidate"
    cases.append(("shop.orders", {"startAfter": invalidate["_id"]}))  # goes on past the drop
    for i, (scope, options) in enumerate(cases):
        cmd, db = command(scope, options)
        assert_same(spark, [path], cmd, db, tmp_path / str(i), split_size=SPLIT)


@pytest.mark.spark
def test_errors_are_the_replay_errors(spark, generated, tmp_path):
    path = generated[".bson"]
    events = _tokens(path, "cluster")
    from pipeline_stages import resume_token as rt

    # A token whose event is not in the stream (280), and one older than the oplog (286).
    decoded = rt.decode(events[10]["_id"])
    missing = {"_id": "nowhere"}
    fake = rt.ResumeTokenData.for_event(
        decoded.cluster_time, "insert", uuid=decoded.uuid, document_key=missing
    ).to_document()
    early = rt.ResumeTokenData.for_event(
        Timestamp(1_600_000_000, 1), "insert", uuid=decoded.uuid, document_key=missing
    ).to_document()
    # An oplog that starts inside a transaction: its chain is lost (286).
    raws = _raw_entries(path)
    cut = next(i for i, r in enumerate(raws) if "partialTxn" in (decode_entry(r).get("o") or {}))
    tail = tmp_path / "tail.bson"
    tail.write_bytes(b"".join(raws[cut + 1 :]))
    cases = [
        ([path], command("cluster", {"resumeAfter": fake})),
        ([path], command("cluster", {"resumeAfter": early})),
        ([tail], command("cluster")),
        ([path], command("cluster", {"resumeAfter": fake, "bogus": 1})),
        ([path], command("cluster", {}, [{"$group": {"_id": 1}}])),
    ]
    for i, (paths, (cmd, db)) in enumerate(cases):
        expected = reference_error(paths, cmd, db)
        assert expected is not None, i
        got = spark_error(spark, [paths], cmd, db, tmp_path / f"e{i}", split_size=SPLIT)
        assert got == expected, i


@pytest.mark.spark
def test_the_output_is_committed_when_every_task_succeeded(spark, generated, tmp_path):
    """Tasks write under `_temporary`; the driver renames their files to Spark's part names and
    writes `_SUCCESS` only when the job succeeded. A failed job leaves an output it replaces
    (`overwrite`) as it was, and none where there was none."""
    from cdcserver.spark.replay import ReplayError, SparkReplay

    path = generated[".bson"]
    raws = _raw_entries(path)
    cut = next(i for i, r in enumerate(raws) if "partialTxn" in (decode_entry(r).get("o") or {}))
    tail = tmp_path / "tail.bson"  # its first transaction's chain is lost: 286 in a task
    tail.write_bytes(b"".join(raws[cut + 1 :]))
    cmd, db = command("cluster")

    def job(paths: list[pathlib.Path], out: pathlib.Path, mode: str) -> SparkReplay:
        return SparkReplay([[str(p) for p in paths]], cmd, db, str(out), fmt="jsonl",
                           split_size=SPLIT, mode=mode)

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(ReplayError) as failed:
        job([tail], out, "overwrite").run(spark)
    assert str(failed.value) == reference_error([tail], cmd, db)
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    with pytest.raises(ReplayError) as exists:
        job([path], out, "errorifexists").run(spark)
    assert str(exists.value) == f"--out {out} exists: give --mode overwrite to replace it"
    summary = job([path], out, "overwrite").run(spark)
    names = sorted(p.name for p in out.iterdir())
    assert "old.txt" not in names and "_temporary" not in names and "_SUCCESS" in names
    written = parts(out, ".txt")
    assert 1 < len(written) <= summary.tasks and len(names) == len(written) + 1
    assert all(re.fullmatch(r"part-\d{5}-[0-9a-f]{32}-c000\.txt", p.name) for p in written)
    expected = reference([path], cmd, db)
    assert b"".join(p.read_bytes() for p in written) == b"".join(
        json_util.dumps(e, json_options=CANONICAL).encode() + b"\n" for e in expected
    )
    fresh = tmp_path / "fresh"
    with pytest.raises(ReplayError):
        job([tail], fresh, "errorifexists").run(spark)
    assert not fresh.exists()


@pytest.mark.spark
def test_shards_merge_by_token(spark, tmp_path):
    """Three shards with overlapping clusterTimes, a collection stream ending at a drop."""
    base = Timestamp(1_720_000_000, 1)
    shards = [
        [Workload(seed=20 + s, shard=s, start=base).write(
            tmp_path / f"shard{s}.bson", 1200, extra=ddl_story if s == 1 else None)]
        for s in range(3)
    ]
    inserts = [{"$match": {"operationType": "insert"}}]  # drops the invalidate itself
    for i, (scope, stages) in enumerate(
        [("cluster", []), ("shop.orders", []), ("shop.orders", inserts)]
    ):
        cmd, db = command(scope, stages=stages)
        expected = list(merged_reference(shards, cmd, db))
        if scope != "cluster":  # ends at shard 1's drop: the other shards' later inserts too
            drop = next(
                e for e in merged_reference(shards, *command(scope))
                if e["operationType"] == "invalidate"
            )
            assert all(e["_id"]["_data"] <= drop["_id"]["_data"] for e in expected)
        out = tmp_path / f"out-{i}"
        summary = spark_replay(spark, shards, cmd, db, out, split_size=200_000)
        assert summary.events == len(expected) or scope != "cluster"
        check_rows(list(read_events(out)), expected)


MILLION = os.environ.get("CDCSERVER_SPARK_MILLION") == "1"


@pytest.mark.spark
@pytest.mark.parametrize(
    "per_shard, split_size",
    [pytest.param(340_000, 32 * 1024 * 1024, id="1M") if MILLION
     else pytest.param(10_000, 512 * 1024, id="30k")],
)
def test_many_entries_in_three_shards(spark, tmp_path, per_shard, split_size):
    """Generated entries in three shards (>= 1M with CDCSERVER_SPARK_MILLION=1, ~5 minutes
    on 2 cores; 30k otherwise): event for event the merged per-shard replays (compared as a
    stream, never all in memory)."""
    import pyarrow.parquet as pq

    base = Timestamp(1_720_000_000, 1)
    shards = [
        [Workload(seed=40 + s, shard=s, start=base).write(tmp_path / f"s{s}.bson", per_shard)]
        for s in range(3)
    ]
    cmd, db = command("cluster")
    out = tmp_path / "out"
    summary = spark_replay(spark, shards, cmd, db, out, split_size=split_size)
    assert summary.scanned >= 3 * per_shard
    assert summary.splits >= 6
    expected = merged_reference(shards, cmd, db)
    count = 0
    for path in parts(out, ".parquet"):
        for batch in pq.ParquetFile(path).iter_batches(columns=["_id", "event"]):
            for token, raw in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                event = next(expected)
                assert raw == event.raw and token == event["_id"]["_data"], count
                count += 1
    assert next(expected, None) is None
    assert count == summary.events


# -- an archive many times the heap ----------------------------------------------------------


class BigWorkload(Workload):
    """The workload with large documents (`doc_bytes` on average), so that gigabytes are a few
    thousand entries: inserts, transactions and their links carry them."""

    def __init__(self, seed: int, shard: int, start: Timestamp, doc_bytes: int) -> None:
        super().__init__(seed, shard, start)
        self.doc_bytes = doc_bytes
        self.blob = "".join(random.Random(seed).choices("abcdefghij", k=2 * doc_bytes))

    def _doc(self) -> dict[str, Any]:
        doc = super()._doc()
        n = self.rng.randrange(self.doc_bytes // 2, self.doc_bytes * 3 // 2)
        doc["blob"] = self.blob[self.next_id % 1000 :][:n]
        return doc

    def write_bytes(self, path: pathlib.Path, target: int) -> int:
        """Entries until the file has `target` bytes; the number of entries."""
        n = 0
        with open(path, "wb") as f:
            while f.tell() < target:
                self.step()
                for entry in self.oplog.entries:
                    f.write(_encode(entry))
                n += len(self.oplog.entries)
                self.oplog.entries.clear()
        return n


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _peak_rss(pid: int) -> tuple[str, int]:
    """(command line, peak resident set in bytes: VmHWM) of a live process."""
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return cmdline.decode(errors="replace"), int(line.split()[1]) * 1024
    except OSError:
        pass
    return "", 0


def _digest_lines(lines: Iterator[bytes]) -> tuple[str, int]:
    import hashlib

    h, n = hashlib.sha256(), 0
    for line in lines:
        h.update(line)
        n += 1
    return h.hexdigest(), n


def _part_lines(out: pathlib.Path) -> Iterator[bytes]:
    for path in parts(out, ".txt"):
        with open(path, "rb") as f:
            yield from f


HEAP = os.environ.get("CDCSERVER_SPARK_HEAP", "256m")  # the JVM's heap in the test below
HEAP_BYTES = int(HEAP[:-1]) << {"m": 20, "g": 30}[HEAP[-1].lower()]


@pytest.mark.spark
def test_archive_eight_times_the_heap(tmp_path):
    """Four shards totalling 8x the JVM heap (256 MiB: a 2 GiB archive of ~128 KiB documents,
    generated to a temporary directory and removed after) through `cdcserver spark-replay
    --driver-memory 256m` on local[2]: the output is `cdcserver replay`'s of the same shards,
    event for event (SHA-256 of the lines), and the JVM's peak resident memory stays a
    fraction of the archive (it held the heap it was given, -Xmx256m)."""
    import subprocess
    import sys
    import tempfile
    import threading

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    work = pathlib.Path(tempfile.mkdtemp(prefix="cdcserver-big-"))
    try:
        base = Timestamp(1_720_000_000, 1)
        total = 8 * HEAP_BYTES
        shards, entries = [], 0
        for s in range(4):
            path = work / f"shard{s}.bson"
            entries += BigWorkload(60 + s, s, base, 128 * 1024).write_bytes(path, total // 4 + 1)
            shards.append([str(path)])
        size = sum(os.path.getsize(p[0]) for p in shards)
        assert size >= 8 * HEAP_BYTES
        out = work / "out"
        args = [
            sys.executable, "-m", "cdcserver.cli", "spark-replay",
            *(a for p in shards for a in ("--oplog", *p)), "--cluster", "--format", "jsonl",
            "--out", str(out), "--master", "local[2]", "--driver-memory", HEAP,
            # Spark keeps 300 MiB of any heap for itself unless told otherwise (its own tests'
            # setting): with it, a 256 MiB heap is a usable one.
            "--conf", "spark.testing.reservedMemory=67108864",
            "--conf", "spark.ui.enabled=false", "--split-size", str(32 * 1024 * 1024),
            "--progress", "10",
        ]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peaks: dict[int, tuple[str, int]] = {}
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.5):
                for pid in _descendants(proc.pid):
                    cmdline, rss = _peak_rss(pid)
                    if rss:
                        peaks[pid] = (cmdline, rss)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            _, err = proc.communicate(timeout=1800)
        finally:
            done.set()
            watcher.join()
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err.decode()[-3000:]
        assert b"entries/s" in err  # progress was reported
        jvm = [
            (c, rss) for c, rss in peaks.values()
            # Not the Java check, nor spark-class's launcher (a short-lived JVM of its own,
            # -Xmx128m, that only prints the driver's command line).
            if c.split(" ")[0].endswith("java") and "-version" not in c
            and "org.apache.spark.launcher.Main" not in c
        ]
        assert jvm and all(f"-Xmx{HEAP}" in c for c, _ in jvm), [c for c, _ in jvm]
        jvm_peak = max(rss for _, rss in jvm)
        assert jvm_peak < size / 2, (jvm_peak, size)

        cmd, db = command("cluster")
        expected = _digest_lines(
            json_util.dumps(e, json_options=CANONICAL).encode() + b"\n"
            for e in merged_reference(shards, cmd, db)
        )
        assert _digest_lines(_part_lines(out)) == expected
        assert expected[1] > entries // 2
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def restore_logging():
    """The CLI points the root logger at the stderr of the moment (pytest's capture, closed
    after the test): put back what was there."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.spark
def test_cli(spark, generated, tmp_path, capsys, restore_logging):
    from cdcserver.cli import main

    out = tmp_path / "cli"
    path = str(generated[".bson"])
    args = ["spark-replay", "--oplog", path, "--out", str(out), "--format", "jsonl",
            "--ns", "shop.items", "--split-size", "100000", "--master", "local[2]"]
    capsys.readouterr()
    assert main(args) == 0
    # Where the time went: each Spark job's wait for its first task, its tasks, the results.
    phases = re.search(r"phases: scan [\d.]+s \(first task after [\d.]+s, tasks [\d.]+s, "
                       r"results after [\d.]+s\), plan [\d.]+s, replay [\d.]+s \(first task "
                       r"after [\d.]+s, tasks [\d.]+s, results after [\d.]+s\), commit",
                       capsys.readouterr().err)
    assert phases is not None
    assert spark.sparkContext._jsc is not None  # the shared session is left running
    ref = tmp_path / "ref.jsonl"
    assert main(["replay", "--oplog", path, "--ns", "shop.items", "--out", str(ref)]) == 0
    text = b"".join(p.read_bytes() for p in parts(out, ".txt"))
    assert text == ref.read_bytes()
    capsys.readouterr()
    assert main(args) == 2  # the output exists: refused before Spark runs anything
    assert capsys.readouterr().err == (
        f"cdcserver spark-replay: --out {out} exists: give --mode overwrite to replace it\n"
    )
    assert main([*args, "--mode", "overwrite", "--options", "[1]"]) == 2


def test_rows_json_is_json_util_canonical():
    """`rows.canonical_json` (the fast path of the eventJson column) == json_util's output."""
    import datetime
    import decimal
    import re

    from bson.binary import Binary
    from bson.code import Code
    from bson.dbref import DBRef
    from bson.decimal128 import Decimal128
    from bson.int64 import Int64
    from bson.max_key import MaxKey
    from bson.min_key import MinKey
    from bson.objectid import ObjectId
    from bson.regex import Regex

    from cdcserver.spark.rows import event_row

    doc = {
        "_id": {"_data": "82AB"}, "operationType": "insert",
        "clusterTime": Timestamp(5, 6), "s": "é\u2028\"x", "b": True, "n": None,
        "i": 1, "big": 2**40, "neg": -(2**31), "l": Int64(3), "f": 1.5, "nan": float("nan"),
        "inf": float("-inf"), "z": -0.0, "e": 1e300,
        "d": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000),
        "old": datetime.datetime(1900, 1, 1), "oid": ObjectId(b"abcdefghijkl"),
        "uuid": Binary(b"0123456789abcdef", 4), "bin": Binary(b"\x00\x01", 0x80),
        "bytes": b"raw", "dec": Decimal128(decimal.Decimal("1.10")), "re": Regex("a.b", "im"),
        "pre": re.compile("x"), "code": Code("f()"), "scope": Code("g()", {"a": 1}),
        "ref": DBRef("c", 1, "db"), "min": MinKey(), "max": MaxKey(),
        "nested": {"a": [1, {"b": [Int64(2), []]}, {}], "": {"x": None}},
        "documentKey": {"_id": ObjectId(b"abcdefghijkl"), "k": [1, 2]},
        "ns": {"db": "d", "coll": "c"},
    }
    raw = RawBSONDocument(bson.encode(doc))
    row = event_row(raw)
    assert row[7] == json_util.dumps(raw, json_options=CANONICAL)
    assert row[5] == json_util.dumps(raw["documentKey"], json_options=CANONICAL)
    assert row[:5] == ("82AB", {"t": 5, "i": 6}, "insert", "d", "c")
    assert row[6] == raw.raw


def test_ranges_that_do_not_join_up_are_detected(tmp_path):
    """The driver's check of the heuristic: a range whose first entry is not where the previous
    range stopped marks its file for a sequential re-read (no Spark needed for the scan)."""
    from cdcserver.spark.replay import ScanContext, _Shard, _verify, scan_split

    path = Workload(seed=4).write(tmp_path / "oplog.bson", 400)
    size = path.stat().st_size
    splits = sp.plan_splits(0, 0, str(path), size, False, size // 4)
    cmd, db = command("shop.orders")
    ctx = ScanContext(cmd, db, None, probe=True)
    shard = _Shard(0, [str(path)], splits, {s.key: scan_split(s, ctx) for s in splits})
    assert _verify(shard) == (set(), None)
    assert sum(m["n"] for m in shard.metas.values()) == 400
    assert any(m["links"] for m in shard.metas.values())  # partialTxn / prepare links kept
    wrong = shard.metas[splits[2].key]
    wrong["first"] += 1  # as if the heuristic had taken a byte inside an entry
    assert _verify(shard)[0] == {0}
