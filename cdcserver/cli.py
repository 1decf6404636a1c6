"""cdcserver: a MongoDB change-stream server.

Any driver's watch() works against it unchanged: it speaks the MongoDB wire protocol and runs
$changeStream as mongod 8.0 does (same events, field order, resume tokens and errors) over
the oplog of its own embedded store, a recorded oplog (mongodump BSON or Extended JSON lines)
or a live replica set (--upstream). It also replays a recorded oplog offline (replay,
spark-replay).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Hashable, Iterator
from importlib import resources
from typing import TYPE_CHECKING, Any, NoReturn

from cdcserver.replay_command import add_stream_arguments, spec_command

# Only what a command needs is imported, in it: `--version` and `--help` import nearly
# nothing, and `serve` only its mode's modules (bench/startup.py measures it).
if TYPE_CHECKING:
    from bson.raw_bson import RawBSONDocument

    from cdcserver.config import Config
    from cdcserver.deployment import Deployment

    # What a replay yields: a batch's events and the oplog entries read for it.
    Replayed = tuple[list[RawBSONDocument], int]
    # One oplog's batch: its events, entries read, post-batch resume token, invalidated.
    ShardBatch = tuple[list[RawBSONDocument], int, dict[str, Any], bool]

log = logging.getLogger(__name__)


def sample_oplog_path() -> str:
    """A small recorded oplog shipped with the package (served when nothing else is given)."""
    return str(resources.files("cdcserver") / "data" / "sample_oplog.jsonl")


def default_config_text() -> str:
    """Every option with its default and a comment: the package's copy of the repository's
    config.example.toml (a wheel ships no repository files; tests/server/test_config.py
    checks that the two are the same)."""
    return (resources.files("cdcserver") / "data" / "config.example.toml").read_text("utf-8")


def cmd_config(args: argparse.Namespace) -> int:
    sys.stdout.write(default_config_text())  # --defaults is required: the only action so far
    return 0


def _setup_logging(level: str, fmt: str) -> None:
    from cdcserver.logs import setup_logging  # text, or JSON lines (cdcserver/logs.py)

    setup_logging(level, fmt)


def cmd_serve(args: argparse.Namespace) -> int:
    from cdcserver.config import ConfigError, load_config

    # Flags override CDCSERVER_* variables, which override the file; all checked alike.
    flags = {
        "server.host": args.host or None,
        "server.port": args.port,
        # One --oplog: one replica set's recording; several: a sharded cluster's, one each.
        "source.oplog": list(args.oplog[0]) if args.oplog and len(args.oplog) == 1 else None,
        "source.follow": True if args.follow else None,
        "store.in_memory": True if args.in_memory else None,
        "store.data_dir": args.data_dir or None,
        "upstream.uri": args.upstream or None,
        "metrics.port": args.metrics_port,
        "server.shards": args.shards,
        "server.unix_socket": False if args.nounixsocket else None,
        "server.unix_socket_prefix": args.unix_socket_prefix,
        "server.unix_socket_permissions": args.file_permissions,
    }
    if args.host and "," in args.host:  # mongod's --bind_ip takes a list
        print(f"cdcserver serve: --bind_ip/--host {args.host}: cdcserver listens on one "
              "address (0.0.0.0: all IPv4 ones)", file=sys.stderr)
        return 2
    try:
        config = load_config(
            args.config, overrides={k: v for k, v in flags.items() if v is not None}
        )
    except ConfigError as exc:
        print(f"cdcserver: {exc}", file=sys.stderr)
        return 2
    conflict = _source_conflict(args, config)
    if conflict:
        print(f"cdcserver serve: {conflict}", file=sys.stderr)
        return 2
    _setup_logging(config.log.level, config.log.format)
    taken = ports_taken(config)
    if taken:  # before the deployment opens: a failed start leaves nothing in the data dir
        print(f"cdcserver: {taken}", file=sys.stderr)
        return 48  # mongod's exit code when it cannot listen (ExitCode::netError)
    deployment = _open_deployment(args, config)
    if deployment is None:
        return 2
    from cdcserver.server import run_server

    return run_server(config, deployment)


def _bind_fails(host: str, port: int) -> bool:
    """True when `host:port` cannot be bound now (as the server binds: SO_REUSEADDR)."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError:
        return False  # the listener reports a bad host itself
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                import errno

                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def ports_taken(config: Config) -> str | None:
    """The message for the first fixed port `serve` would listen on that is taken (the wire
    port, an explicit metrics port), checked before anything is opened; None if all are
    free. Port 0 is never taken."""
    from cdcserver.config import port_in_use

    sc, mc = config.server, config.metrics
    if sc.port and _bind_fails(sc.host, sc.port):
        return port_in_use("server.port", "--port", sc.host, sc.port)
    if mc.enabled and mc.port and _bind_fails(mc.host, mc.port):
        return port_in_use("metrics.port", "--metrics-port", mc.host, mc.port)
    return None


def data_dir_problem(path: str, key: str) -> str | None:
    """None once `path` is a directory (made with its parents, as the store would), else the
    one line saying which directory cannot be made, why, and what to do: a raw OSError
    ("[Errno 2] No such file or directory: 'x/data'") names neither the option nor the cause
    (a dangling symlink, a file in the way, a parent not writable)."""
    try:
        os.makedirs(path, exist_ok=True)
        return None
    except OSError as exc:
        cause = exc.strerror or str(exc)
    where = os.path.abspath(path)
    up = where  # the deepest part of the path that exists: what is in the way
    while not os.path.lexists(up) and os.path.dirname(up) != up:
        up = os.path.dirname(up)
    fix = f"create {where}"
    if os.path.islink(up) and not os.path.exists(up):
        target = os.path.join(os.path.dirname(up), os.readlink(up))
        cause = f"{up} is a symbolic link to {target}, which does not exist"
        fix = f"create {os.path.normpath(target)}"
    elif not os.path.isdir(up):
        cause, fix = f"{up} is not a directory", f"move {up} away"
    elif not os.access(up, os.W_OK | os.X_OK):
        cause, fix = f"{up} is not writable", f"make {up} writable"
    return (f"{key}: cannot create the data directory {where}: {cause}; {fix}, or give "
            "another directory")


def _open_deployment(args: argparse.Namespace, config: Config) -> Deployment | None:
    """The serving mode the flags and config name (None: it cannot open, said on stderr)."""
    from cdcserver.embedded.persist import DataDirError
    from cdcserver.sources.file import OplogFileError

    directory = None
    if config.upstream.uri:
        if config.upstream.retain_dir:
            directory = data_dir_problem(config.upstream.retain_dir, "upstream.retain_dir")
    elif not (args.oplog or config.source.oplog or args.sample or config.store.in_memory):
        directory = data_dir_problem(config.store.data_dir, "store.data_dir (--data-dir)")
    if directory is not None:
        print(f"cdcserver: {directory}", file=sys.stderr)
        return None
    try:
        if config.upstream.uri:  # a mongos: its sidecar; a replica set: its tail
            from cdcserver.deployments.sidecar import open_sidecar
            from cdcserver.deployments.upstream import open_upstream

            return open_sidecar(config) or open_upstream(config)
        if args.oplog and len(args.oplog) > 1:  # one recording per shard
            from cdcserver.deployments.recorded_shards import open_recorded_shards

            return open_recorded_shards(args.oplog)
        if config.source.oplog or args.sample:
            from cdcserver.deployments.recorded import open_recorded

            paths = config.source.oplog or [sample_oplog_path()]
            return open_recorded(paths, follow=config.source.follow)
    except (OplogFileError, DataDirError) as exc:  # DataDirError: upstream.retain_dir
        print(f"cdcserver: {exc}", file=sys.stderr)
        return None
    try:
        if config.server.shards:  # a sharded cluster: N embedded shards, a front
            from cdcserver.deployments.cluster import open_cluster

            return open_cluster(config, config.server.shards)
        from cdcserver.deployments.embedded import open_embedded

        return open_embedded(config)
    except (OSError, ValueError, DataDirError) as exc:  # DataDirError: in use, corrupt
        print(f"cdcserver: {exc}", file=sys.stderr)
        return None


def _source_conflict(args: argparse.Namespace, config: Config) -> str | None:
    """Flags that name a source the config already replaces (the flags among themselves are
    refused by argparse): one source is served, so a second one is an error, not ignored."""
    if args.sample and (config.upstream.uri or config.source.oplog):
        other = "upstream.uri" if config.upstream.uri else "source.oplog"
        return f"--sample cannot be used with {other} (set in the config or environment)"
    if args.follow and not config.source.oplog:
        return "--follow needs an oplog file to follow (--oplog, or source.oplog)"
    return None




def replay_events(paths: list[str], cmd: dict[str, Any], db: str) -> Iterator[Replayed]:
    """The events `cdcserver replay` writes, in order (shared with the Spark replay's tests)."""
    for events, n, _token, _invalidated in _shard_batches(paths, cmd, db):
        yield events, n


def replay_shards(shards: list[list[str]], cmd: dict[str, Any], db: str
                  ) -> Iterator[Replayed]:
    """Several shards' oplogs (one `--oplog` each) merged as mongos merges their streams
    (`pipeline_stages/merge.py`), ending at the first invalidate in token order (even one a
    user's `$match` drops: the shard's stream ends there); one shard: `replay_events`."""
    if len(shards) == 1:
        yield from replay_events(shards[0], cmd, db)
        return
    from pipeline_stages.merge import ShardMerge

    merge: ShardMerge[RawBSONDocument] = ShardMerge(range(len(shards)))
    # By the merge's shard keys (their indexes): it hands them back as Hashable.
    streams: dict[Hashable, Iterator[ShardBatch]] = {
        i: _shard_batches(paths, cmd, db) for i, paths in enumerate(shards)}
    cut: str | None = None  # the first invalidate's token: the merged stream ends there
    while not merge.exhausted:
        out = merge.pop_ready()
        if cut is not None:
            kept = [e for e in out if e["_id"]["_data"].upper() <= cut]
            if kept:
                yield kept, 0
            if len(kept) < len(out) or merge.exhausted:
                return
        elif out:
            yield out, 0
        shard = merge.blocking()
        if shard is None:
            continue
        batch = next(streams[shard], None)
        if batch is None:
            merge.close(shard)
            continue
        events, n, token, invalidated = batch
        merge.push(shard, events, token)
        if invalidated:  # the token is the invalidate's: nothing merges after it
            key = token["_data"].upper()
            cut = key if cut is None else min(cut, key)
            merge.close(shard)
        elif cut is not None and token["_data"].upper() > cut:
            merge.close(shard)  # all it has left comes after the end
        yield [], n


def _shard_batches(paths: list[str], cmd: dict[str, Any], db: str) -> Iterator[ShardBatch]:
    """One oplog's batches: (events, entries read, post-batch resume token, whether the
    stream ended at an invalidate)."""
    from cdcserver.sources.file import OplogStream
    from pipeline_stages.errors import MongoError
    from pipeline_stages.lookups import ExternalImages, answer_from, push_answering
    from pipeline_stages.pipeline import ChangeStreamPipeline
    from pipeline_stages.spec import parse_aggregate

    oplog = OplogStream(paths)  # read once, in bounded memory
    spec = parse_aggregate(cmd, db)
    start = spec.requested_start()
    if start is None:
        oldest = oplog.oldest_entry()
        start = oldest["ts"] if oldest is not None else oplog.start_for_new_stream()
    # What the pipeline says it needs is answered here, synchronously, from the recorded data:
    # transaction entries from the oplog; images are not recorded (each one is null).
    pipeline = ChangeStreamPipeline(spec, start, history=oplog, images=ExternalImages())
    answer = answer_from(oplog, None)
    try:
        pipeline.check_history(oplog.oldest_entry())
        position = start
        while True:
            entries = oplog.read_from(position, 1000)
            if not entries:
                break
            last = entries[-1]["ts"]
            push_answering(pipeline, entries, last, answer)
            batch = pipeline.next_batch(None)
            yield batch.events, len(entries), batch.post_batch_resume_token, batch.invalidated
            while pipeline.pending_count:  # a batch stops at the 16 MiB reply budget
                batch = pipeline.next_batch(None)
                yield batch.events, 0, batch.post_batch_resume_token, batch.invalidated
            position = type(last)(last.time, last.inc + 1)
            if pipeline.invalidated:
                break
    except MongoError:
        oplog.read_to_end()  # a bad file is the error, before the pipeline's (as spark-replay)
        raise


def cmd_replay(args: argparse.Namespace) -> int:
    from bson import json_util

    from cdcserver.sources.file import OplogFileError
    from pipeline_stages.errors import MongoError

    canonical = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
    _setup_logging("info", "text")
    try:
        cmd, db = spec_command(args)
    except ValueError as exc:
        print(f"cdcserver replay: {exc}", file=sys.stderr)
        return 2
    from cdcserver.config import oplog_path_problem

    for path in (path for shard in args.oplog for path in shard):
        problem = oplog_path_problem(path)
        if problem:
            print(f"cdcserver replay: --oplog {path}: {problem}", file=sys.stderr)
            return 2
    try:
        out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115
    except OSError as exc:
        print(f"cdcserver replay: cannot write --out {args.out}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    entries = events = 0
    try:
        for batch, n in replay_shards(args.oplog, cmd, db):
            entries += n
            for event in batch:
                out.write(json_util.dumps(event, json_options=canonical) + "\n")
                events += 1
            if entries % 100_000 < n:
                log.info("replay: %d entries read, %d events written", entries, events)
    except (OplogFileError, MongoError) as exc:
        detail = f"{exc.code} {exc.code_name}: {exc.errmsg}" if isinstance(exc, MongoError) else exc
        print(f"cdcserver replay: {detail}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise  # the reader went away (`| head`): main() exits quietly
    except OSError as exc:  # the output: disk full, a file system gone...
        where = f"--out {args.out}" if args.out else "stdout"
        print(f"cdcserver replay: cannot write {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        if out is not sys.stdout:
            with contextlib.suppress(OSError):
                out.close()
    log.info(
        "replay: %d entries read, %d events written in %.1fs",
        entries, events, time.monotonic() - started,
    )
    return 0


def _summary(config: Config) -> str:
    """One line on what `serve` would do with this config."""
    if config.upstream.uri:
        source = "upstream " + config.upstream.uri.split("@")[-1]  # no credentials
    elif config.source.oplog:
        source = f"{len(config.source.oplog)} oplog file(s)"
    elif config.store.in_memory:
        source = "embedded store in memory"
    else:
        source = f"embedded store in {config.store.data_dir}"
    metrics = config.metrics
    # Unset: the default port, or a free one if it is taken (cdcserver/metrics.py).
    metrics_port = metrics.port if metrics.port is not None else "9216 (or a free port)"
    return (
        f"listen {config.server.host}:{config.server.port}, {source}, "
        f"auth {'on' if config.auth.enabled else 'off'}, "
        f"tls {'on' if config.tls.enabled else 'off'}, "
        f"metrics {f'{metrics.host}:{metrics_port}' if metrics.enabled else 'off'}"
    )


def cmd_check_config(args: argparse.Namespace) -> int:
    from cdcserver.config import check_config

    config, errors = check_config(args.file)
    if errors or config is None:
        for error in errors:
            print(f"{args.file}: {error}")
        print(f"{len(errors)} error{'s' if len(errors) != 1 else ''}")
        return 2
    print(f"OK: {args.file}: {_summary(config)}")
    return 0


def ping_uri(config: Config) -> str:
    """The URI that reaches this config's listener from the same host (the HEALTHCHECK)."""
    host = config.server.host
    if host in ("0.0.0.0", ""):  # a wildcard listener answers on loopback
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    # A liveness probe on loopback: the certificate names another host, so it is not checked.
    tls = "?tls=true&tlsInsecure=true" if config.tls.enabled else ""
    return f"mongodb://{host}:{config.server.port}/{tls}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).split(", Timeout: ")[0]  # pymongo appends its topology description
    return " ".join(text.split())


def cmd_ping(args: argparse.Namespace) -> int:
    """Exit 0 when the server answers `ping`, 1 (and why, on one line) otherwise."""
    from cdcserver.config import ConfigError, load_config

    uri = args.uri
    if uri is None:
        try:
            config = load_config(args.config)
        except ConfigError as exc:
            print(f"cdcserver ping: {_one_line(exc)}", file=sys.stderr)
            return 1
        if config.server.port == 0:
            print("cdcserver ping: server.port is 0 (any free port): give --uri",
                  file=sys.stderr)
            return 1
        uri = ping_uri(config)
    from pymongo import MongoClient  # only here: keeps the other commands' start fast
    from pymongo.errors import PyMongoError

    timeout_ms = max(1, int(args.timeout * 1000))
    where = uri.partition("://")[2].rpartition("@")[2].split("/")[0]  # no credentials
    try:
        client: MongoClient[dict[str, Any]] = MongoClient(
            uri, directConnection=True, serverSelectionTimeoutMS=timeout_ms,
            connectTimeoutMS=timeout_ms, socketTimeoutMS=timeout_ms, appname="cdcserver ping",
        )
    except (PyMongoError, ValueError, TypeError) as exc:
        print(f"cdcserver ping: bad URI: {_one_line(exc)}", file=sys.stderr)
        return 1
    try:
        client.admin.command("ping")
    except PyMongoError as exc:
        print(f"cdcserver ping: {_one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"ok {where}")
    return 0


def cmd_hash_password(args: argparse.Namespace) -> int:
    """Print a `[[auth.users]]` block; the password comes from stdin or a prompt, not argv."""
    import getpass

    from cdcserver.auth import parse_role, user_toml

    try:
        roles = [parse_role(r) for r in args.role or []]
    except ValueError as exc:
        print(f"cdcserver hash-password: {exc}", file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("cdcserver hash-password: the passwords differ", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("cdcserver hash-password: empty password", file=sys.stderr)
        return 2
    counts = {"SCRAM-SHA-256": args.iterations_sha256, "SCRAM-SHA-1": args.iterations_sha1}
    sys.stdout.write(user_toml(args.user, args.db, roles, password, iterations=counts))
    return 0


def version() -> str:
    """The installed distribution's version ("unknown" when run from a bare source tree)."""
    from importlib import metadata

    try:
        return metadata.version("cdcserver")
    except metadata.PackageNotFoundError:
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """Usage errors on one line (the usage itself is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """`--version`: the distribution's metadata is read only when asked for."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        print(f"cdcserver {version()}")  # on stdout, as argparse's version action
        parser.exit(0)


def _cmd_archive_export(args: argparse.Namespace) -> int:
    if args.snapshot:  # the materialized copy at a time, and the oplog after it
        from cdcserver.materialize.export import cmd_snapshot_export

        return cmd_snapshot_export(args)
    from cdcserver.sources.retained import cmd_archive_export  # sqlite3, the store: to run

    return cmd_archive_export(args)


def _add_archive_parser(sub: Any) -> None:
    """`archive export`: the sidecar's retained log (cdcserver/sources/retained.py)."""
    archive = sub.add_parser(
        "archive", help="work with the sidecar's retained log (upstream.retain_dir)"
    )
    actions = archive.add_subparsers(dest="archive_command", required=True, metavar="ACTION")
    export = actions.add_parser(
        "export",
        help="write the retained log from a resume token or a time on as mongodump's "
        "oplog.bson (read by `cdcserver replay`, `serve --oplog` and `spark-replay`)",
    )
    where = export.add_mutually_exclusive_group()
    where.add_argument("--retain-dir", help="the retained log's directory (upstream.retain_dir)")
    where.add_argument("--config", help="a config file whose upstream.retain_dir to read")
    since = export.add_mutually_exclusive_group(required=True)
    since.add_argument(
        "--since", metavar="TOKEN|TIME",
        help="a resume token ({\"_data\": ...} or its hex), a Timestamp T:I, seconds since "
        "the epoch or an ISO-8601 time: entries from then on (the token's own entry included)",
    )
    since.add_argument(
        "--snapshot", nargs="?", const="latest", metavar="TOKEN|TIME",
        help="the materialized copy (upstream.materialize) as of that time (default: the "
        "newest it applied) in mongodump's layout, and the entries after it as oplog.bson",
    )
    export.add_argument("--out", required=True, help="output directory (oplog.bson in it)")
    export.set_defaults(func=_cmd_archive_export)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="cdcserver", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`cdcserver COMMAND --help` lists a command's options; `cdcserver config "
        "--defaults` prints every config option with its default.",
    )
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve change streams over the MongoDB wire protocol")
    serve.add_argument(
        "--config", help="TOML config file (`cdcserver config --defaults` prints every option)"
    )
    # --bind_ip and --dbpath: mongod's spellings, as its unix-socket flags below.
    serve.add_argument("--host", "--bind_ip", dest="host",
                       help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 27017)")
    # One source is served: naming two is an error, not a silent precedence.
    source = serve.add_mutually_exclusive_group()
    source.add_argument(
        "--oplog", nargs="+", action="append", metavar="PATH",
        help="recorded oplog files to serve, in order; repeat --oplog for each shard of a "
        "cluster (served as a mongos, streams merged)",
    )
    serve.add_argument("--follow", action="store_true", help="tail the last oplog file")
    source.add_argument(
        "--in-memory", action="store_true",
        help="embedded store kept in memory only (for tests)",
    )
    source.add_argument(
        "--data-dir", "--dbpath", dest="data_dir",
        help="embedded store data directory (default ./cdcserver-data)",
    )
    source.add_argument(
        "--upstream", metavar="URI",
        help="tail a live replica set's oplog and serve its change streams (a sidecar); "
        "other commands are forwarded to it",
    )
    serve.add_argument(
        "--metrics-port", type=int,
        help="Prometheus /metrics port (default 9216, or a free port, logged, when 9216 is "
        "taken; a port given here must be free; 0: any free port)",
    )
    source.add_argument(
        "--sample", action="store_true",
        help="serve the small recorded oplog shipped with cdcserver",
    )
    serve.add_argument(
        "--shards", type=int, metavar="N",
        help="an embedded sharded cluster: N shards (each on its own port) behind a mongos "
        "front on --port (with --in-memory or --data-dir)",
    )
    # mongod's spellings of its net.unixDomainSocket options (and ours).
    serve.add_argument(
        "--nounixsocket", "--no-unix-socket", action="store_true",
        help="do not listen on the Unix domain socket <prefix>/mongodb-<port>.sock",
    )
    serve.add_argument(
        "--unixSocketPrefix", "--unix-socket-prefix", dest="unix_socket_prefix",
        metavar="DIR", help="directory of the Unix domain socket (default /tmp)",
    )
    serve.add_argument(
        "--filePermissions", "--unix-socket-permissions", dest="file_permissions",
        metavar="OCTAL", help="permissions of the Unix domain socket file (default 0700)",
    )
    serve.set_defaults(func=cmd_serve)

    replay = sub.add_parser("replay", help="run the change-stream pipeline over oplog files")
    replay.add_argument(
        "--oplog", nargs="+", action="append", required=True, metavar="PATH",
        help="one oplog's files, in order; repeat --oplog for each shard of a cluster",
    )
    add_stream_arguments(replay)
    replay.add_argument("--out", help="output file (default: stdout)")
    replay.set_defaults(func=cmd_replay)

    from cdcserver.spark.cli import add_parser  # its options and checks; pyspark only to run

    add_parser(sub)
    _add_archive_parser(sub)

    config = sub.add_parser("config", help="print the configuration (--defaults)")
    config.add_argument(
        "--defaults", action="store_true", required=True,
        help="print every option with its default and a comment, as a TOML file to edit",
    )
    config.set_defaults(func=cmd_config)

    check = sub.add_parser(
        "check-config",
        help="validate a config file (with CDCSERVER_* overrides); print every error",
    )
    check.add_argument("file", help="TOML config file")
    check.set_defaults(func=cmd_check_config)

    ping = sub.add_parser(
        "ping", help="exit 0 when a server answers ping, 1 otherwise (a health check)"
    )
    target = ping.add_mutually_exclusive_group()
    target.add_argument(
        "--uri",
        help="MongoDB URI, TLS and auth options as usual (default: mongodb://127.0.0.1:27017)",
    )
    target.add_argument(
        "--config", help="reach the listener this config file (and CDCSERVER_*) describes"
    )
    ping.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    ping.set_defaults(func=cmd_ping)

    hash_password = sub.add_parser(
        "hash-password",
        help="print an [[auth.users]] config block with SCRAM credentials (password on stdin)",
    )
    hash_password.add_argument("--user", required=True)
    hash_password.add_argument("--db", default="admin", help="authentication database")
    hash_password.add_argument(
        "--role", action="append", metavar="ROLE[@DB]",
        help="e.g. read@shop, readWrite@shop, readAnyDatabase (admin), root; repeatable",
    )
    hash_password.add_argument("--iterations-sha256", type=int, default=15_000)
    hash_password.add_argument("--iterations-sha1", type=int, default=10_000)
    hash_password.set_defaults(func=cmd_hash_password)

    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)  # each command's cmd_* (set_defaults(func=...))
        return code
    except KeyboardInterrupt:
        return 128 + signal.SIGINT  # Ctrl-C: quiet, as Unix tools exit
    except BrokenPipeError:
        # The reader of our output went away (`cdcserver replay ... | head -1`): stop quietly
        # as a tool killed by SIGPIPE would; stdout goes to /dev/null so the interpreter's
        # final flush does not report the broken pipe again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + getattr(signal, "SIGPIPE", 13)  # (no SIGPIPE on Windows)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "replay_events"]
