"""The context mongod 8.0 adds to an error raised while a read runs (not while it is parsed).

mongod parses a command whole before it runs it; what fails while its plan executor produces
documents is rethrown with `exception.addContext(...)`, the code unchanged:

- aggregate (run_aggregate.cpp, and find / distinct / count on a view, which run as an
  aggregation): "PlanExecutor error during aggregation :: caused by :: <message>";
- find (find_cmd.cpp): "Executor error during find command: <db>.<coll> :: caused by :: ...";
- distinct (distinct.cpp): "Executor error during distinct command :: caused by :: ...".

A command declares its context (`command_context`); the store's scans run under `executing`,
which adds it. The embedded store's stages parse their specifications when they first run, so
an aggregation's pipeline is first run over no documents and no collections (`parse`): what
fails then is a parse error, as mongod's, raised before any document is read. Its query
engine parses expressions lazily, as it evaluates them, so only errors whose codes mongod
raises nowhere but in its executors get the context (`_EXECUTION_CODES`).

mongod folds an expression whose arguments are all constants when it optimizes the query,
before it runs: such an expression's error reads "Failed to optimize pipeline :: caused by ::
..." in an aggregation (Pipeline::optimizePipeline), and bare in a find (its projection and
`$expr` are optimized while the query is planned). `fold` evaluates those expressions first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from cdcserver.embedded import engine, query
from pipeline_stages.errors import MongoError

AGGREGATION = "PlanExecutor error during aggregation"
OPTIMIZE = "Failed to optimize pipeline"
DISTINCT = "Executor error during distinct command"

# The errors that get the context: those mongod raises only while it runs a query, never while
# it parses one. The store's query engine parses expressions lazily (as it evaluates them), so
# a code mongod raises from both places (2 BadValue, 14 TypeMismatch...) cannot tell here which
# it was: only these, checked in mongod's source to be thrown from an executor, get it.
_EXECUTION_CODES = frozenset({
    50,  # MaxTimeMSExpired: the operation's deadline, checked as documents are produced
    139,  # JSInterpreterFailure: a $where / $function / $accumulator body that throws
    241,  # ConversionFailure: $convert / $toInt / $toDate ... on a value it cannot convert
    16608,  # $divide by zero (before 8.0's BadValue; the store's $mod / $divide may use it)
})
# ... and the BadValue of a division by zero (ExpressionDivide::evaluate), by its message.
_EXECUTION_MESSAGES = ((2, "can't $divide by zero"), (2, "division by zero"))

_CONTEXT: ContextVar[str | None] = ContextVar("executor_error_context", default=None)


def find_context(ns: str) -> str:
    return f"Executor error during find command: {ns}"


def fold_find(filter_doc: Any, projection: Any, on_view: bool) -> None:
    """`fold` for a find: its projection's computed fields and its filter's `$expr` (bare;
    a find on a view runs as an aggregation, whose optimizer's context they get)."""
    fold([*stage_expressions({"$project": projection or {}}),
          *stage_expressions({"$match": filter_doc or {}})], OPTIMIZE if on_view else None)


@contextlib.contextmanager
def command_context(context: str) -> Iterator[None]:
    """The running command's executor context: errors its scans raise get it."""
    token = _CONTEXT.set(context)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def _is_execution_error(err: MongoError) -> bool:
    return err.code in _EXECUTION_CODES or any(
        err.code == code and err.errmsg.startswith(text) for code, text in _EXECUTION_MESSAGES)


def add_context(err: MongoError) -> MongoError:
    """`err` with the running command's context, once (nested scans add nothing more)."""
    context = _CONTEXT.get()
    if context is None or getattr(err, "executor_context", False) or (
        not _is_execution_error(err)
    ):
        return err
    err.errmsg = f"{context} :: caused by :: {err.errmsg}"
    err.args = (err.errmsg,)
    err.executor_context = True  # type: ignore[attr-defined]
    return err


def parse(stages: list[Any], first_match: Mapping[str, Any] | None = None) -> None:
    """Raise the parse errors of an aggregation's `stages` (normalized) before it runs: each
    stage run over no documents, every other collection empty (so `$lookup`, `$unionWith`
    and `$facet` parse their sub-pipelines without running them); then its constant
    expressions folded (`fold`), those of a leading `$match` the store runs apart included."""
    if first_match is not None:
        fold(stage_expressions({"$match": first_match}), OPTIMIZE)
    if not stages:
        return
    try:
        query.run_sync(query.pipeline([], engine.query_database("", None), stages, []))
    except MongoError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise engine.engine_error(exc) from None
    fold((e for stage in stages for e in stage_expressions(stage)), OPTIMIZE)


# Expressions mongod never folds (not deterministic, or evaluated per document by design).
_NOT_FOLDED = frozenset({"$rand", "$function", "$accumulator", "$meta", "$let", "$map",
                         "$filter", "$reduce", "$sortArray", "$setField", "$getField"})
_EXPRESSION_STAGES = frozenset({"$addFields", "$set", "$replaceRoot", "$replaceWith"})


def _operator(value: Any) -> str | None:
    if isinstance(value, Mapping) and len(value) == 1:
        name = next(iter(value))
        if isinstance(name, str) and name.startswith("$"):
            return name
    return None


def _constant(value: Any) -> bool:
    """Whether an expression has no field path and no variable: mongod folds it."""
    if isinstance(value, str):
        return not value.startswith("$")
    if isinstance(value, list):
        return all(_constant(v) for v in value)
    if isinstance(value, Mapping):
        name = _operator(value)
        if name == "$literal":
            return True
        if name is not None:
            return name not in _NOT_FOLDED and _constant(value[name])
        return all(_constant(v) for v in value.values())
    return True


def _folded(expression: Any) -> Iterator[Any]:
    """The largest constant operator expressions in `expression`."""
    name = _operator(expression)
    if name is not None:
        if name == "$literal":
            return
        if _constant(expression):
            yield expression
            return
        yield from _folded(expression[name])
    elif isinstance(expression, Mapping):
        for v in expression.values():
            yield from _folded(v)
    elif isinstance(expression, list):
        for v in expression:
            yield from _folded(v)


def _projected(spec: Any) -> Iterator[Any]:
    """A projection's computed fields (not its 0 / 1 / true / false flags)."""
    if not isinstance(spec, Mapping):
        return
    for value in spec.values():
        if _operator(value) is not None or isinstance(value, (str, list)):
            yield value
        elif isinstance(value, Mapping):
            yield from _projected(value)


def stage_expressions(stage: Any) -> Iterator[Any]:
    """The expressions of a stage that mongod optimizes: `$project`'s computed fields,
    `$addFields` / `$set` / `$replaceRoot` / `$replaceWith`, a `$match`'s `$expr`, `$group`'s
    `_id` and accumulator arguments."""
    if not isinstance(stage, Mapping) or len(stage) != 1:
        return
    name, arg = next(iter(stage.items()))
    if name == "$project":
        yield from _projected(arg)
    elif name in _EXPRESSION_STAGES:
        yield arg
    elif name == "$match" and isinstance(arg, Mapping) and "$expr" in arg:
        yield arg["$expr"]
    elif name == "$group" and isinstance(arg, Mapping):
        for field, value in arg.items():
            if field == "_id":
                yield value
            elif _operator(value) is not None:
                yield next(iter(value.values()))


def fold(expressions: Iterable[Any], context: str | None) -> None:
    """Evaluate the constant parts of `expressions` as mongod's optimizer does: an execution
    error (see `_EXECUTION_CODES`) is raised with `context` (None: bare), marked so that no
    executor context is added to it; anything else is left for the query to raise."""
    for expression in expressions:
        for constant in _folded(expression):
            try:
                engine.run_pipeline([{}], None, [{"$project": {"_id": 0, "v": constant}}])
            except MongoError as err:
                if not _is_execution_error(err):
                    continue
                if context is not None:
                    err.errmsg = f"{context} :: caused by :: {err.errmsg}"
                    err.args = (err.errmsg,)
                err.executor_context = True  # type: ignore[attr-defined]
                raise


@contextlib.contextmanager
def executing() -> Iterator[None]:
    """Around a scan of the store (the query running, its parsing done): its errors as
    MongoErrors (see crud_common.engine_errors), with the command's context."""
    try:
        yield
    except MongoError as err:
        add_context(err)
        raise
    except Exception as exc:  # noqa: BLE001
        raise add_context(engine.engine_error(exc)) from None
