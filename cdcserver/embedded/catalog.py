"""The embedded store's catalog: collections (options, validators), views and DDL.

mongod's CollectionCatalog and DatabaseHolder: which collections and views each database has,
their options and UUIDs, and the DDL that changes them (create, drop, rename, collMod,
dropDatabase), each logged as mongod 8.0 logs it. A mixin of `Store` (`store.py`): its methods
reach the store's other parts (oplog writer, indexes, transactions) through `self`.
"""

from __future__ import annotations

import dataclasses
import uuid as uuid_module
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from cdcserver.embedded import engine, timeseries, view_reads
from cdcserver.embedded.store_types import ID_INDEX as ID_INDEX
from cdcserver.embedded.store_types import Collection as Collection
from cdcserver.embedded.store_types import DocumentValidationError as DocumentValidationError
from cdcserver.embedded.store_types import ErrorWithFields as ErrorWithFields
from cdcserver.embedded.store_types import id_key as id_key
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.query_engine import Database
from pipeline_stages.value_string import bson_obj_string

if TYPE_CHECKING:
    from cdcserver.embedded.state import StoreState
else:
    StoreState = object  # a base for the type checker only (state.py)

SYSTEM_VIEWS = "system.views"
VIEW_MAX_DEPTH = 20  # ViewGraph::kMaxViewDepth
# CollectionOptions::toBSON's order (mongod 8.0), used for create entries and listCollections.
OPTION_ORDER = (
    "clusteredIndex", "capped", "size", "max", "autoIndexId", "temp",
    "changeStreamPreAndPostImages", "storageEngine", "indexOptionDefaults", "validator",
    "validationLevel", "validationAction", "collation", "viewOn", "pipeline", "timeseries",
    "expireAfterSeconds", "encryptedFields",
)

# Documents quoted in command-level messages (duplicate keys, index specs): BSONObj::toString.
bson_string = bson_obj_string


def ordered_options(options: Mapping[str, Any], *, as_stored: bool = True) -> dict[str, Any]:
    out = {k: options[k] for k in OPTION_ORDER if k in options}
    if out.get("changeStreamPreAndPostImages", {}).get("enabled") is False:
        del out["changeStreamPreAndPostImages"]  # toBSON leaves out a disabled option
    if as_stored and out.get("capped") and "size" in out:
        out["size"] = capped_size(out["size"])
    return out


def _index_version(spec: Mapping[str, Any]) -> int:
    v = spec.get("v", 2)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 2


def capped_size(value: Any) -> Any:
    """A capped collection's `size` as mongod keeps it: CollectionOptions::parse rounds it up
    to a multiple of 256 (`size += 0xff; size &= ~0xff`), and toBSON appends it with
    appendNumber (an int up to 2^30, else a long)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value  # the create's own checks answer
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return value
        value = int(value)  # safeNumberLong truncates
    size = (int(value) + 0xFF) & ~0xFF
    return size if -(1 << 30) <= size <= 1 << 30 else Int64(size)


def _since(c: Collection) -> int:
    """The commit number since which the catalog has `c` under its current name."""
    return max(c.created_seq, c.named_seq)


def validate_collection_name(db: str, coll: str) -> None:
    if not db or any(ch in db for ch in '/\\. "$\0'):
        raise MongoError(73, f"Invalid database name: '{db}'")
    if not coll:
        raise MongoError(73, f"Invalid namespace specified '{db}.{coll}'")
    if "$" in coll or "\0" in coll or coll.startswith("."):
        raise MongoError(73, f"Invalid collection name: {coll}")


class CatalogMixin(StoreState):
    """Collections, views and DDL (mongod's CollectionCatalog)."""

    def _records(self, c: Collection) -> OrderedDict[bytes, dict[str, Any]]:
        """`c`'s documents as the running command reads them now: the running transaction's
        view when it stands in for them (see `_swap_view`), else the working set."""
        view = self._views.get(c.uuid)
        return c.records if view is None else view

    def documents(self, c: Collection) -> dict[bytes, dict[str, Any]]:
        txn = self.txn
        if txn is not None and txn.lsid and c.uuid not in self._views and (
            c.uuid in txn.overlay or self._history
        ):
            self._swap_view(c, txn)
        return self._records(c)

    def query_database(self, db: str) -> Database:
        """Database `db`'s collections for an aggregation that reads others (`$lookup`...),
        read when its stage runs."""

        def resolve(name: str) -> Mapping[bytes, dict[str, Any]] | None:
            return view_reads.resolved_documents(self, db, name, self._records)

        return engine.query_database(db, resolve)

    def get(self, db: str, coll: str) -> Collection | None:
        """The collection `db.coll` as the running command sees it: outside transactions the
        committed catalog; in a transaction (or snapshot read) the collections it created
        itself, else the committed ones its snapshot has (under the names they had then)."""
        txn = self._txn()
        if txn is None:
            return self.catalog.get((db, coll))
        own = txn.created.get((db, coll))
        if own is not None:
            return own
        c = self.catalog.get((db, coll))
        if c is not None and _since(c) <= txn.snapshot:
            return c
        for since, until, key, old in self._retired:  # dropped or renamed since the snapshot
            if key == (db, coll) and since <= txn.snapshot < until:
                return old
        return None

    def _visible(self) -> dict[tuple[str, str], Collection]:
        """Every collection the running command sees (see `get`)."""
        txn = self._txn()
        if txn is None:
            return self.catalog
        snapshot = txn.snapshot
        seen = {k: c for k, c in self.catalog.items() if _since(c) <= snapshot}
        for since, until, key, old in self._retired:
            if since <= snapshot < until:
                seen[key] = old
        seen.update(txn.created)
        return seen

    def _retire(self, c: Collection) -> None:
        """`c` leaves the catalog under its name (a drop, a rename, a rename's dropped target)
        at the commit number `self._seq` (the DDL's). mongod reads the catalog at a snapshot's
        timestamp: a transaction or snapshot read older than that still reads `c` under that
        name, as its documents were then (`Store._view`), and a write to it there is a
        WriteConflict (`_check_write_conflict`). So, while such a snapshot is open, a copy
        under that name is kept, holding the documents (the same records while `c` lives on
        under another name; those of the moment of the drop, which a drop takes away)."""
        if self._live:
            old = dataclasses.replace(c, created_by=None)
            self._retired.append((_since(c), self._seq, (c.db, c.name), old))

    def databases(self) -> list[str]:
        return sorted({db for db, _ in self._visible()})

    def collections_of(self, db: str) -> list[Collection]:
        return sorted(
            (c for (d, _), c in self._visible().items() if d == db), key=lambda c: c.name
        )

    def _save_meta(self, c: Collection) -> None:
        if self.persist is not None and c.created_by is None:  # else at its commit
            self.persist.put_collection(c.db, c.name, c.uuid, c.meta_bytes())

    def create_collection(
        self, db: str, coll: str, options: Mapping[str, Any] | None = None,
        id_index: Mapping[str, Any] | None = None, uuid: bytes | None = None,
    ) -> Collection:
        """A new collection; `uuid` gives it one already chosen (a sharded collection's, the
        same on every shard) rather than a new one, so that its create entry has it too."""
        validate_collection_name(db, coll)
        # The oplog entry has the options the command gave (a capped size as given: the
        # create event shows it, ddl_create_event.js); the catalog keeps them as parsed.
        given = ordered_options(options or {}, as_stored=False)
        options = ordered_options(options or {})
        c = Collection(db, coll, uuid or uuid_module.uuid4().bytes, options)
        # The _id index as mongod builds it: the requested version, its own name and key, and
        # the collection's default collation; a clustered collection has none (its clustered
        # index, an option, takes its place).
        spec: dict[str, Any] = {
            "v": (id_index or {}).get("v", 2), "key": {"_id": 1}, "name": "_id_"
        }
        collation = options.get("collation")
        if isinstance(collation, Mapping) and collation.get("locale") != "simple":
            spec["collation"] = collation
        id_spec: dict[str, Any] | None = spec
        if "clusteredIndex" in options:
            id_spec = None
        else:
            c.indexes[0] = spec
        txn = self._txn()
        if txn is not None:  # the catalog gets it at commit (commit_transaction)
            c.created_by = txn
            txn.colls[c.uuid] = c
            txn.created[(db, coll)] = c
        else:
            self._seq += 1  # transactions whose snapshot is older do not see it
            c.created_seq = self._seq
            self.catalog[(db, coll)] = c
        self._save_meta(c)
        if timeseries.is_viewless(c):  # its entries are marked from its create on
            self.timeseries_uuids().add(c.uuid)
        # makeCreateCollCmdObj: the _id index spec goes into the entry for versions >= 2 only
        entry: dict[str, Any] = {"create": coll, **given}
        if id_spec is not None and _index_version(id_spec) >= 2:
            entry["idIndex"] = id_spec
        self.append_oplog("c", f"{db}.$cmd", entry, ui=c.ui)
        return c

    def cap_collection(self, c: Collection, inserted: bytes) -> None:
        """After an insert into a capped collection over its `max` documents or `size` bytes:
        its oldest documents deleted, in insertion order, until it fits, never the one just
        inserted (mongod's cappedDeleteUntilBelowConfiguredMaximum). The deletes are logged
        as deletes, as a primary has replicated them since 5.0."""
        if not c.options.get("capped") or self._txn() is not None:
            return
        max_docs = int(c.options.get("max") or 0)
        max_size = int(c.options.get("size") or 0)
        records = self._records(c)
        self.record_ids(c)
        sizes = c.capped_sizes  # key -> (document, its BSON size): each document encoded once
        total = 0
        for key, doc in records.items():
            known = sizes.get(key)
            if known is None or known[0] is not doc:
                known = sizes[key] = (doc, len(bson_bytes.encode(doc)))
            total += known[1]
        count = len(records)
        while (max_size and total > max_size) or (max_docs > 0 and count > max_docs):
            oldest = next(iter(records), None)
            if oldest is None or oldest == inserted:
                break
            pre = records[oldest]
            known = sizes.pop(oldest, None)
            total -= known[1] if known is not None else len(bson_bytes.encode(pre))
            count -= 1
            self.delete_document(c, pre)
            c.capped_ids.pop(oldest, None)

    def record_ids(self, c: Collection) -> dict[bytes, int]:
        """A capped collection's RecordIds (1, 2, ... in insertion order, as mongod numbers a
        capped collection's records): what a tailable cursor's position is."""
        records = self._records(c)
        ids = c.capped_ids
        if len(ids) != len(records) or next(reversed(records), None) not in ids:
            for key in [k for k in ids if k not in records]:
                del ids[key]
                c.capped_sizes.pop(key, None)
            for key in records:
                if key not in ids:
                    c.last_record_id += 1
                    ids[key] = c.last_record_id
        return ids

    def ensure_collection(self, db: str, coll: str) -> Collection:
        """The collection an insert writes to (created when missing); for a time-series
        collection, a `TimeseriesView` whose inserts go into its buckets (the collection
        itself when it is viewless, 9.0's form)."""
        c = self.get(db, coll)
        if c is not None:
            if timeseries.is_viewless(c):
                return timeseries.TimeseriesView(db, coll, c.uuid, c.options, buckets=c)
            return c
        view = self.view(db, coll)
        if timeseries.is_timeseries_view(view):
            assert view is not None
            buckets = self.get(db, str(view["viewOn"]))
            if buckets is not None and "timeseries" in buckets.options:
                return timeseries.TimeseriesView(db, coll, buckets.uuid, buckets.options,
                                                 buckets=buckets)
        self.check_not_view(db, coll)
        return self.create_collection(db, coll)

    # -- views ------------------------------------------------------------------------------------
    # As on mongod, a view is a document `{_id: "<db>.<view>", viewOn, pipeline[, collation]}`
    # of the collection `<db>.system.views` (created with the first view); creating, modifying
    # and dropping a view insert, replace and delete that document, which is all the oplog
    # records (and what change streams turn into create/modify/drop events).

    def view(self, db: str, name: str) -> dict[str, Any] | None:
        """The definition of the view `db.name`, or None."""
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        if system_views is None:
            return None
        return self.documents(system_views).get(id_key(f"{db}.{name}"))

    def views_of(self, db: str) -> list[dict[str, Any]]:
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        if system_views is None:
            return []
        prefix = db + "."
        return [d for d in self.documents(system_views).values()
                if isinstance(d.get("_id"), str) and d["_id"].startswith(prefix)]

    def check_not_view(self, db: str, coll: str) -> None:
        """166 CommandNotSupportedOnView, as mongod refuses writes and collection commands on a
        view."""
        if self.view(db, coll) is not None:
            raise MongoError(166, f"Namespace {db}.{coll} is a view, not a collection")

    def put_view(
        self, db: str, name: str, view_on: str, pipeline: list[Any],
        collation: Mapping[str, Any] | None = None,
    ) -> None:
        """Create or redefine a (validated) view: an insert into `system.views`, or a
        replacement of its document (mongod's ViewsForDatabase::_upsertIntoCatalog)."""
        doc: dict[str, Any] = {"_id": f"{db}.{name}", "viewOn": view_on, "pipeline": pipeline}
        if collation:
            doc["collation"] = dict(collation)
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        if system_views is None:  # mongod creates it in its own write unit, before the insert
            system_views = self.create_collection(db, SYSTEM_VIEWS)
        old = self.documents(system_views).get(id_key(doc["_id"]))
        if old is None:
            self.insert_document(system_views, doc)
        else:
            self.update_document(system_views, old, doc, kind="replacement", update=doc)

    def drop_view(self, db: str, name: str) -> bool:
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        old = self.view(db, name)
        if system_views is None or old is None:
            return False
        self.delete_document(system_views, old)
        return True

    def resolve_view(self, db: str, name: str) -> tuple[str, list[Any]] | None:
        """(the collection a view reads, the pipeline that reads it: the innermost view's
        stages first), or None when `db.name` is no view (view_catalog_helpers::resolveView)."""
        pipeline: list[Any] = []
        current = name
        for _ in range(VIEW_MAX_DEPTH):
            view = self.view(db, current)
            if view is None:
                return (current, pipeline) if current != name else None
            pipeline = [*view.get("pipeline", []), *pipeline]
            current = view["viewOn"]
        raise MongoError(165, "View depth too deep or view cycle detected; maximum depth is "
                         f"{VIEW_MAX_DEPTH}")

    # -- 9.0's viewless time-series conversion (setFeatureCompatibilityVersion) -----------------

    def timeseries_collections(self, viewless: bool) -> list[tuple[str, str]]:
        """(db, coll) of every time-series collection in the viewful form (a view on its
        buckets) or in the viewless one, in catalog order (forEachTimeseriesCollectionFromDb)."""
        found: list[tuple[str, str]] = []
        for (db, name), c in sorted(self.catalog.items()):
            if "timeseries" not in c.options:
                continue
            if viewless and timeseries.is_viewless(c):
                found.append((db, name))
            elif not viewless and timeseries.is_buckets(name):
                main = name[len(timeseries.BUCKETS_PREFIX):]
                if timeseries.is_timeseries_view(self.view(db, main)):
                    found.append((db, main))
        return found

    def convert_timeseries(self, db: str, coll: str, to_viewless: bool) -> None:
        """upgradeToViewlessTimeseries / downgradeFromViewlessTimeseries: the buckets
        collection renamed over the view (upgrade: the view dropped, the bucket validator
        cleared) or back under `system.buckets.` with the view recreated (downgrade), the UUID
        kept, none of it logged but one `upgradeDowngradeViewlessTimeseries` entry at a single
        timestamp, as mongod logs it."""
        buckets_name = timeseries.buckets_name(coll)
        source = self.get(db, buckets_name if to_viewless else coll)
        if source is None or "timeseries" not in source.options:
            return
        ts_options = dict(source.options["timeseries"])
        if not to_viewless and self.get(db, buckets_name) is not None:
            return  # a conflicting buckets collection: mongod's tassert, left as it is
        if not to_viewless and self.catalog.get((db, SYSTEM_VIEWS)) is None:
            self.create_collection(db, SYSTEM_VIEWS)  # logged, in its own unit (as mongod)
        # The conversion's own entry is unmarked: every stream sees its rename.
        self.timeseries_uuids().discard(source.uuid)
        self.unreplicated = True
        try:
            if to_viewless:
                self.drop_view(db, coll)
                self._rename_in_catalog(source, coll)
                source.options.pop("validator", None)
            else:
                self._rename_in_catalog(source, buckets_name)
                self.put_view(db, coll, buckets_name, timeseries.view_pipeline(ts_options),
                              source.options.get("collation"))
                source.options["validator"] = timeseries.bucket_validator(
                    ts_options["timeField"])
            self._save_meta(source)
        finally:
            self.unreplicated = False
        self.append_oplog("c", f"{db}.$cmd", {timeseries.VIEWLESS_COMMAND: coll,
                                              "isUpgrade": to_viewless}, ui=source.ui)
        if to_viewless:
            self.timeseries_uuids().add(source.uuid)

    def _rename_in_catalog(self, c: Collection, to_coll: str) -> None:
        """`c` under another name of its database, unlogged (rename_collection's catalog
        part)."""
        self._seq += 1
        del self.catalog[(c.db, c.name)]
        self._retire(c)
        if self.persist is not None:
            self.persist.rename_collection(c.db, c.name, c.db, to_coll)
        c.name = to_coll
        c.named_seq = self._seq
        self.catalog[(c.db, to_coll)] = c

    # -- DDL --------------------------------------------------------------------------------------

    def drop_collection(self, db: str, coll: str) -> Collection | None:
        c = self.catalog.pop((db, coll), None)
        if c is None:
            return None
        n = len(self.documents(c))
        self._seq += 1  # older snapshots still see it
        self._retire(c)
        c.records = OrderedDict()
        if self.persist is not None:
            self.persist.delete_collection(db, coll, c.uuid)
        self.append_oplog("c", f"{db}.$cmd", {"drop": coll}, ui=c.ui, o2={"numRecords": n})
        if not self.collections_of(db):
            self.emptied_dbs.add(db)
        return c

    def drop_database(self, db: str) -> bool:
        colls = self.collections_of(db)
        if not colls and db not in self.emptied_dbs:
            return False
        for c in colls:
            self.drop_collection(db, c.name)
        self.emptied_dbs.discard(db)
        self.append_oplog("c", f"{db}.$cmd", {"dropDatabase": 1})
        return True

    def rename_collection(
        self, src: Collection, to_db: str, to_coll: str, drop_target: bool, stay_temp: bool = False
    ) -> None:
        validate_collection_name(to_db, to_coll)
        target = self.catalog.get((to_db, to_coll))
        if src.db != to_db:
            self._rename_across_databases(src, to_db, to_coll, drop_target)
            return
        o: dict[str, Any] = {
            "renameCollection": src.ns, "to": f"{to_db}.{to_coll}", "stayTemp": stay_temp,
        }
        self._seq += 1  # older snapshots see the names as they were
        if target is not None:
            o["dropTarget"] = target.ui
            self.catalog.pop((to_db, to_coll))
            self._retire(target)
            target.records = OrderedDict()
            if self.persist is not None:
                self.persist.delete_collection(to_db, to_coll, target.uuid)
        self.append_oplog("c", f"{src.db}.$cmd", o, ui=src.ui)
        del self.catalog[(src.db, src.name)]
        self._retire(src)
        if self.persist is not None:
            self.persist.rename_collection(src.db, src.name, to_db, to_coll)
        src.name = to_coll
        src.named_seq = self._seq
        self.catalog[(to_db, to_coll)] = src
        if "temp" in src.options and not stay_temp:
            del src.options["temp"]
            self._save_meta(src)

    def _rename_across_databases(
        self, src: Collection, to_db: str, to_coll: str, drop_target: bool
    ) -> None:
        """mongod's renameBetweenDBs: copy into a temporary collection of the target database,
        rename it onto the target, drop the source."""
        suffix = uuid_module.uuid4().hex[:5]
        tmp = self.create_collection(
            to_db, f"tmp{suffix}.renameCollection", {**src.options, "temp": True}
        )
        for spec in src.indexes[1:]:
            self._add_index(tmp, dict(spec), empty=True)
        for doc in list(self.documents(src).values()):
            self.insert_document(tmp, dict(doc))
        self.rename_collection(tmp, to_db, to_coll, drop_target, stay_temp=False)
        self.drop_collection(src.db, src.name)

    def coll_mod(
        self, c: Collection, o: dict[str, Any], new_options: dict[str, Any],
        index_changes: tuple[str, dict[str, Any], dict[str, Any]] | None,
    ) -> None:
        """Apply a validated collMod: `o` is the oplog's `o` (the options as given)."""
        o2: dict[str, Any] = {"collectionOptions_old": {"uuid": c.ui, **c.options}}
        if index_changes is not None:
            name, changes, old = index_changes
            spec = c.index(name)
            assert spec is not None
            o2["indexOptions_old"] = old
            for k, v in changes.items():
                if k == "unique" and v and spec.get("unique") is not True:
                    spec.pop("prepareUnique", None)
                    trial = {**spec, "unique": True}
                    self._build_unique(c, trial)
                if k == "hidden" and v is False:
                    spec.pop("hidden", None)
                elif k == "prepareUnique" and v is False:
                    spec.pop("prepareUnique", None)
                else:
                    spec[k] = v
        # (an option set to None is removed: a time-series expireAfterSeconds: "off")
        c.options = ordered_options({k: v for k, v in {**c.options, **new_options}.items()
                                     if v is not None})
        self._save_meta(c)
        self.append_oplog("c", f"{c.db}.$cmd", o, ui=c.ui, o2=o2)
