"""Materialized namespaces: a sidecar's local copy of the upstream collections it is asked to
materialize, kept up to date from the tail with each document's versions (ts-stamped) for as
long as the retained log keeps their entries. See docs/materialize.md.

* `patterns.py`: `[upstream] materialize` patterns (`db.coll`, `db.*`).
* `apply.py`: oplog application as pure functions (entry, current document -> new document).
* `store.py`: the copy (SQLite, `<retain_dir>/materialized.sqlite3`): catalog and versions.
* `sync.py`: the `Materializer`: initial sync (clone, then apply idempotently from the clone's
  start, as mongod's initial sync), the apply loop over the retained log, re-sync, pruning.
* `snapshot.py`: find / aggregate at `readConcern {level: snapshot, atClusterTime: T}`.
* `protocol.py`: what the image lookup path asks of it (no imports: no circles).
"""
