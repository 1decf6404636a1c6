"""Atlas Search, as mongod 8.0 answers it when no search service is configured (no mongot,
no `searchIndexManagementHostAndPort`): 31082 SearchNotEnabled.

* The search index commands (`createSearchIndexes`, `updateSearchIndex`, `dropSearchIndex`,
  `listSearchIndexes`: src/mongo/db/commands/search_index_commands.cpp) are parsed by their
  IDL (search_index_commands.idl, strict: 40415, 40414, 14), then refused first thing in
  `typedRun` (`throwIfNotRunningWithRemoteSearchIndexManagement`), before the collection is
  looked up.
* The `$listSearchIndexes` stage refuses with the same text, `$search`, `$searchMeta` and
  `$vectorSearch` with theirs (mongot_cursor.cpp `throwIfNotRunningWithMongotHostConfigured`),
  each when the pipeline is parsed, before its own specification is looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdcserver.commands.arguments import is_string, missing, unknown_field, wrong_type
from cdcserver.commands.base import Handler, family
from cdcserver.commands.write_parsing import GENERIC_ARGUMENTS
from cdcserver.context import ConnectionState, ServerState
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

TABLE: dict[str, Handler] = {}
command = family(TABLE)

SEARCH_NOT_ENABLED = 31082
_HOW_TO = "https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs."
# search_index_common.cpp throwIfNotRunningWithRemoteSearchIndexManagement
INDEX_MANAGEMENT_MESSAGE = (
    "Using Atlas Search Database Commands and the $listSearchIndexes aggregation stage "
    "requires additional configuration. Please connect to Atlas or an AtlasCLI local "
    f"deployment to enable. For more information on how to connect, see {_HOW_TO}"
)
# mongot_cursor.cpp doThrowIfNotRunningWithMongotHostConfigured (no space after "enable.")
MONGOT_MESSAGE = (
    "Using $search and $vectorSearch aggregation stages requires additional configuration. "
    "Please connect to Atlas or an AtlasCLI local deployment to enable.For more information "
    f"on how to connect, see {_HOW_TO}"
)
_STAGE_MESSAGES = {
    "$listSearchIndexes": INDEX_MANAGEMENT_MESSAGE,
    "$search": MONGOT_MESSAGE,
    "$searchMeta": MONGOT_MESSAGE,
    "$vectorSearch": MONGOT_MESSAGE,
}
# Stages whose specification holds pipelines that are parsed with theirs.
_SUB_PIPELINES = ("$lookup", "$unionWith", "$facet")


def check_search_stages(pipeline: Any) -> None:
    """31082 for the first search stage of `pipeline` (or of a `$lookup` / `$unionWith` /
    `$facet` pipeline in it), in the order mongod parses the stages."""
    if not isinstance(pipeline, list):
        return
    for stage in pipeline:
        if not isinstance(stage, Mapping) or len(stage) != 1:
            continue
        name = next(iter(stage))
        text = _STAGE_MESSAGES.get(name)
        if text is not None:
            raise MongoError(SEARCH_NOT_ENABLED, text)
        if name not in _SUB_PIPELINES:
            continue
        spec = stage[name]
        if name == "$facet" and isinstance(spec, Mapping):
            for sub in spec.values():
                check_search_stages(sub)
        elif isinstance(spec, Mapping):
            check_search_stages(spec.get("pipeline"))


def _parse(cmd: Mapping[str, Any], name: str, fields: Mapping[str, str],
           required: tuple[str, ...] = ()) -> None:
    """The IDL parse of a search index command (namespace `concatenate_with_db`, strict)."""
    coll = cmd.get(name)
    if not is_string(coll):
        raise MongoError(73, f"collection name has invalid type {type_name(coll)}")
    for key, value in cmd.items():
        if key == name or key in GENERIC_ARGUMENTS or value is None:
            continue  # (the IDL parser skips a null like an absent field)
        expected = fields.get(key)
        if expected is None:
            raise unknown_field(f"{name}.{key}")
        if expected == "string" and not is_string(value):
            raise wrong_type(f"{name}.{key}", value, "string")
        if expected == "object" and not isinstance(value, Mapping):
            raise wrong_type(f"{name}.{key}", value, "object")
        if expected == "array":
            if not isinstance(value, list):
                raise wrong_type(f"{name}.{key}", value, "array")
            for i, item in enumerate(value):
                _index_definition(item, f"{name}.{key}", i)
    for key in required:
        if cmd.get(key) is None:
            raise missing(f"{name}.{key}")


def _index_definition(item: Any, where: str, i: int) -> None:
    """One of createSearchIndexes' `indexes` (IDL IndexDefinition, strict)."""
    if not isinstance(item, Mapping):
        raise wrong_type(f"{where}.{i}", item, "object")
    for key, value in item.items():
        if value is None:
            continue
        if key in ("name", "type"):
            if not is_string(value):
                raise wrong_type(f"{where}.{key}", value, "string")
        elif key == "definition":
            if not isinstance(value, Mapping):
                raise wrong_type(f"{where}.{key}", value, "object")
        else:
            raise unknown_field(f"{where}.{key}")
    if item.get("definition") is None:
        raise missing(f"{where}.definition")


def _not_enabled() -> MongoError:
    return MongoError(SEARCH_NOT_ENABLED, INDEX_MANAGEMENT_MESSAGE)


@command("createSearchIndexes")
async def create_search_indexes(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _parse(cmd, "createSearchIndexes", {"indexes": "array"}, required=("indexes",))
    raise _not_enabled()


@command("updateSearchIndex")
async def update_search_index(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _parse(cmd, "updateSearchIndex", {"name": "string", "id": "string", "definition": "object"},
           required=("definition",))
    raise _not_enabled()


@command("dropSearchIndex")
async def drop_search_index(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _parse(cmd, "dropSearchIndex", {"name": "string", "id": "string"})
    raise _not_enabled()


@command("listSearchIndexes")
async def list_search_indexes(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _parse(cmd, "listSearchIndexes", {"name": "string", "id": "string"})
    raise _not_enabled()
