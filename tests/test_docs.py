"""docs/ followed word for word, as tests/test_readme.py follows README.md.

Every Python and TOML block of docs/ is run here as written (against a server started with a
free port, put in place of the port in its URI), or is in NOT_RUN with why it cannot be; a
block that is neither fails `test_every_block_is_run_or_says_why_not`. Some shell blocks
whose commands run on one machine are run too. Every relative link of README.md,
CONTRIBUTING.md and docs/ must name a file that exists and, with `#anchor`, a heading in it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
from pymongo import MongoClient

from tests.test_readme import GUARD_S, ROOT, Shell, _free_port, _python, _with_port

DOCS = ROOT / "docs"
PAGES = {path.name: path.read_text() for path in sorted(DOCS.glob("*.md"))}

# (page, a string only that block holds) -> why it is not run here.
NOT_RUN = {
    ("security.md", "cdc.internal"): "a TLS server at cdc.internal with its users: "
    "tests/server/test_auth.py and tests/server/test_tls.py connect the same way",
    ("spark.md", 'format("cdcserver")'): "pyspark, Java 17 and a query that runs until stopped: "
    "tests/spark/test_spark_source_from_now.py runs the same query",
}
# Blocks the tests below run: (page, the same kind of string).
RUN = {
    ("fanout.md", "maxPoolSize=0"),
    ("fidelity.md", "ResumeTokenData.for_event"),
    ("testing.md", "failGetMoreAfterCursorCheckout"),
    ("sidecar.md", "retain_dir ="),
    ("security.md", "[auth]"),
    # tests/materialize/test_materialize_docs.py
    ("materialize.md", "materialize ="),
    ("materialize.md", "full_document_before_change"),
    ("materialize.md", "snapshot_then_watch(orders"),
}


def blocks(page: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", PAGES[page], re.M | re.S)


def block(page: str, lang: str, containing: str) -> str:
    found = [code for kind, code in blocks(page) if kind == lang and containing in code]
    assert len(found) == 1, f"not one ```{lang} block with {containing!r} in docs/{page}"
    return found[0]


def test_every_block_is_run_or_says_why_not():
    claimed = {**{key: "run" for key in RUN}, **NOT_RUN}
    for page in PAGES:
        for lang, code in blocks(page):
            if lang not in ("python", "toml"):
                continue
            owners = [key for key in claimed if key[0] == page and key[1] in code]
            assert len(owners) == 1, f"docs/{page}: a ```{lang} block run nowhere:\n{code}"
    for page, containing in claimed:
        assert any(containing in code for _, code in blocks(page)), (page, containing)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_links_name_files_and_headings_that_exist():
    sources = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
    checked = 0
    for source in sources:
        text = re.sub(r"^```.*?^```", "", source.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s): not checked offline
            path, _, anchor = target.partition("#")
            where = (source.parent / path).resolve() if path else source
            assert where.exists(), f"{source.name}: {target}"
            if anchor:
                assert anchor in _anchors(where.read_text()), f"{source.name}: {target}"
            checked += 1
    assert checked > 20, checked


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert f"(docs/{page}" in readme, page


# -- fidelity.md ----------------------------------------------------------------------------------

def test_the_resume_token_example_runs(tmp_path):
    code = block("fidelity.md", "python", "ResumeTokenData.for_event")
    token = _python(code + "\nprint(token['_data'])\n", tmp_path).strip()
    comment = re.search(r"\{'_data': '([0-9A-F]+)\.\.\.([0-9A-F]+)'\}", code)
    assert comment, code
    assert token.startswith(comment.group(1)) and token.endswith(comment.group(2)), token


# -- testing.md -----------------------------------------------------------------------------------

def test_the_fail_point_example_passes(tmp_path, default_metrics_port_held):
    """The page's pytest example for consumers' resume logic, against `cdcserver serve
    --in-memory` (what its comment names): both its tests pass ("Both run at once")."""
    port = _free_port()
    server = Shell(f"{sys.executable} -m cdcserver.cli serve --in-memory --port {port}", tmp_path)
    try:
        server.wait_for(r"INFO serving ")
        code = block("testing.md", "python", "failGetMoreAfterCursorCheckout")
        assert "`cdcserver serve --in-memory`" in code
        (tmp_path / "test_consumer.py").write_text(_with_port(code, 27017, port))
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_consumer.py"],
            cwd=tmp_path, capture_output=True, text=True, timeout=GUARD_S * 2,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 passed" in result.stdout, result.stdout
    finally:
        assert server.interrupt() == 0, server.text()


# -- configuration.md, sidecar.md, security.md: the config files ----------------------------------

def _check_config(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdcserver.cli", "check-config", path.name],
                          cwd=path.parent, capture_output=True, text=True, timeout=GUARD_S)


def test_the_check_config_example_prints_its_errors(tmp_path):
    """The page's `check-config my.toml` with a my.toml holding the three mistakes it names."""
    shown = block("configuration.md", "", "$ cdcserver check-config my.toml").splitlines()
    assert shown[0] == "$ cdcserver check-config my.toml"
    printed = shown[1:shown.index("3 errors") + 1]
    my = tmp_path / "my.toml"
    my.write_text('[server]\nport = 70000\n[store]\nsynchronous = "fast"\n[tls]\nenabled = true\n')
    result = _check_config(my)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (result.stdout + result.stderr).splitlines() == printed


def test_the_retained_log_config_is_valid(tmp_path):
    code = block("sidecar.md", "toml", "retain_dir =")
    tomllib.loads(code)
    (tmp_path / "retain.toml").write_text(code)
    result = _check_config(tmp_path / "retain.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "upstream mongodb://db1,db2,db3/?replicaSet=rs0" in result.stdout, result.stdout


def _hash_password(args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "hash-password", *args.split()],
        input="a-password\n", capture_output=True, text=True, timeout=GUARD_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_hash_password_example_prints_its_block():
    shown = block("security.md", "", "cdcserver hash-password").splitlines()
    command = re.fullmatch(r'\$ echo "\$APP_PASSWORD" \| cdcserver hash-password (.*)', shown[0])
    assert command, shown[0]
    printed = _hash_password(command.group(1)).splitlines()
    assert shown[-1] == "..."  # the scram_sha_1 keys, as the sha_256 ones
    for want, got in zip(shown[1:-1], printed, strict=False):
        if re.match(r"(salt|stored_key|server_key) = ", want):  # random per run
            assert got.split(" = ")[0] == want.split(" = ")[0], (got, want)
        else:
            assert got == want
    assert shown[-2] == "[auth.users.scram_sha_1]" and len(printed) > len(shown) - 1, printed


def test_the_auth_and_tls_config_is_valid(tmp_path):
    """The page's config with the block hash-password prints where its comment says: only
    the certificate files it names (not here) are missing."""
    code = block("security.md", "toml", "[auth]")
    users = _hash_password("--user app --role read@shop")
    comment = "# ...the [[auth.users]] blocks from hash-password...\n"
    assert comment in code
    path = tmp_path / "cdcserver.toml"
    path.write_text(code.replace(comment, "").rstrip() + "\n\n" + users)
    tomllib.loads(path.read_text())
    result = _check_config(path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (result.stdout + result.stderr).splitlines() == [
        f"{path.name}: tls.certificate_file: no such file: /etc/cdcserver/server.pem",
        f"{path.name}: tls.ca_file: no such file: /etc/cdcserver/clients-ca.pem",
        "2 errors",
    ]


# -- sharding.md, replay.md: commands that run on one machine -------------------------------------

def test_the_embedded_cluster_command_serves_a_mongos(tmp_path, default_metrics_port_held):
    command = block("sharding.md", "", "--shards 2").split("#")[0].strip()
    assert command == "cdcserver serve --in-memory --shards 2 --port 27017", command
    port = _free_port()
    server = Shell(f"{sys.executable} -m cdcserver.cli "
                   + command.removeprefix("cdcserver ").replace("27017", str(port)), tmp_path)
    try:
        server.wait_for(r"INFO serving ")
        with MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=20000) as c:
            assert c.admin.command("hello")["msg"] == "isdbgrid"
            shards = c.admin.command("listShards")["shards"]
            assert [shard["_id"] for shard in shards] == ["shard0", "shard1"], shards
    finally:
        assert server.interrupt() == 0, server.text()


def test_the_replay_command_writes_the_inserts(tmp_path):
    """The page's `cdcserver replay` as written, on the package's sample oplog written where
    the command reads it (`dump/local/oplog.rs.bson`)."""
    from bson import json_util

    from cdcserver.cli import sample_oplog_path
    from cdcserver.testing import write_oplog

    command = block("replay.md", "", "cdcserver replay").replace("\\\n", " ").strip()
    assert command.startswith("cdcserver replay --oplog dump/local/oplog.rs.bson --ns shop.orders")
    entries = [json_util.loads(line) for line in pathlib.Path(sample_oplog_path()).read_text()
               .splitlines() if line.strip()]
    (tmp_path / "dump" / "local").mkdir(parents=True)
    write_oplog(tmp_path / "dump" / "local" / "oplog.rs.bson", entries)
    result = subprocess.run(
        ["bash", "-c", f"exec {sys.executable} -m cdcserver.cli {command.split(' ', 1)[1]}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=GUARD_S,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    inserts = [e for e in entries if e["op"] == "i" and e["ns"] == "shop.orders"]
    assert len(events) == len(inserts) > 0, result.stdout
    assert {e["operationType"] for e in events} == {"insert"}
    assert [e["documentKey"] for e in events] == [
        json.loads(json_util.dumps({"_id": e["o"]["_id"]},
                                   json_options=json_util.CANONICAL_JSON_OPTIONS))
        for e in inserts
    ]


def test_the_python_image_named_is_the_dockerfiles():
    """The base image the README and docs/ say the Dockerfile builds on is the one it does
    (issue 29: "python:3.12-slim" stayed in the text when the Dockerfile moved on)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    arg = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.M)
    assert arg, "the Dockerfile's ARG PYTHON_IMAGE"
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["${PYTHON_IMAGE}"] * 2
    named = {(name, image)
             for name, text in {"README.md": (ROOT / "README.md").read_text(), **PAGES}.items()
             for image in re.findall(r"\bpython:[\w.-]+", text)}
    assert named, "no page names the image any more: drop this test with the sentence"
    assert {image for _name, image in named} == {arg.group(1)}, named


@pytest.mark.parametrize("page", sorted(PAGES))
def test_each_page_starts_with_its_title(page):
    assert PAGES[page].startswith("# "), page


# -- fanout.md ------------------------------------------------------------------------------------

MANY_STREAMS = 150  # more than PyMongo's default maxPoolSize (100)
_MANY_STREAMS_PROBE = """
import asyncio
from pymongo import AsyncMongoClient

async def main(uri):
{client_line}
    coll = client.docs.many
    streams = [await coll.watch([{{"$match": {{"operationType": "insert"}}}}]) for _ in range({n})]
    got = [[] for _ in streams]

    async def read(i, stream):
        while len(got[i]) < {writes}:
            event = await stream.try_next()
            if event is not None:
                got[i].append(event["fullDocument"]["w"])

    readers = asyncio.gather(*(read(i, s) for i, s in enumerate(streams)))
    for w in range({writes}):
        await coll.insert_one({{"w": w}})
        await asyncio.sleep(0.02)  # 50 writes/s: the readers' getMores cycle meanwhile
    await asyncio.wait_for(readers, {guard})
    print(sum(g == list(range({writes})) for g in got))
    await client.close()

asyncio.run(main("{uri}"))
"""


def test_the_many_streams_client_gets_every_event_on_every_stream(tmp_path):
    """The page's client line, with more streams than PyMongo's default pool: each of them
    gets every write once, in order (counts, never times)."""
    from cdcserver.testing import EmbeddedServer

    line = block("fanout.md", "python", "maxPoolSize=0").strip().splitlines()
    assert len(line) == 1 and line[0].startswith("client = AsyncMongoClient(uri,"), line
    with EmbeddedServer() as server:
        code = _MANY_STREAMS_PROBE.format(client_line="    " + line[0], n=MANY_STREAMS,
                                          writes=20, guard=GUARD_S, uri=server.uri)
        out = _python(code, tmp_path).strip()
    assert out == str(MANY_STREAMS), out
