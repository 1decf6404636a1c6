"""`$where`, `$function`, `$accumulator`: JavaScript, run by V8 (mini-racer) as mongod runs it.

mongod hands `$where` code to its script engine: the code is turned into a function
(`parseJSFunctionOrExpression`: a function stays one, an expression or statements become a
function returning the last expression), called once per document with the document as `this`
(and `obj`); a truthy result matches. Server-side JavaScript has `sleep(ms)`. A JavaScript
error fails the query with 139 JSInterpreterFailure; the operation's time limit stops it
(50 MaxTimeMSExpired).

A scan whose filter holds `$where` runs in a thread (query.py's OFFLOAD, as for backtracking
regexes): V8 runs without the GIL, so a `sleep` or a long predicate holds that operation only,
and the thread's deadline bounds each call. Each thread has its own V8 isolate. Inside a write
(update or delete filters) the predicate runs on the loop thread, as the write itself does.

`$function` (an expression operator, registered into pipeline_stages/expressions.py) calls its
body with its evaluated `args`; the result comes back as mongod's ValueWriter writes it (every
number a double). It runs where its pipeline runs (on the loop for an aggregation).

Documents reach JavaScript as JSON with mongod's shell types where a predicate is likely to
touch them: dates are `Date`s, ObjectIds have `str` and compare by `str`, 64-bit integers and
decimals are numbers; binary data is an object `{base64, subType}`.
"""

from __future__ import annotations

import atexit
import base64
import datetime
import json
import re
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from cdcserver.embedded import regex as embedded_regex
from pipeline_stages import accumulators, expressions
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name, value_string

# What every scope has before a predicate: sleep() (Atomics.wait blocks this isolate only, and
# V8's termination on timeout interrupts it), ObjectId-like values, and the document reviver.
_PRELUDE = r"""
function sleep(ms) { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms); }
function ObjectId(hex) {
  if (!(this instanceof ObjectId)) return new ObjectId(hex);
  this.str = hex;
}
ObjectId.prototype.toString = function () { return 'ObjectId("' + this.str + '")'; };
ObjectId.prototype.valueOf = function () { return this.str; };
ObjectId.prototype.equals = function (other) {
  return other instanceof ObjectId && other.str === this.str;
};
function __cdcRevive(key, value) {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    var one = Object.keys(value).length === 1;
    if (one && typeof value.$date === "number") return new Date(value.$date);
    if (one && typeof value.$oid === "string") return new ObjectId(value.$oid);
  }
  return value;
}
// parseJSFunctionOrExpression, without SpiderMonkey's Reflect.parse: V8 compiling each
// reading decides. A function stays one; code with a top-level `return` is a function body;
// else the last expression (the whole code, or what follows its last `;` or line break) is
// returned.
function __cdcSource(src) {
  src = src.trim();
  while (src.endsWith(";")) src = src.slice(0, -1).trimEnd();
  if (/^function\b/.test(src)) {
    try { eval("(" + src + "\n)"); return "(" + src + "\n)"; } catch (e) {}
  }
  try { eval("if (false) {\n" + src + "\n}"); } catch (e) {
    return "(function() {\n" + src + "\n})";  // a body (return outside a function)
  }
  var cuts = [-1];
  for (var i = src.length - 1; i >= 0; i--) if (src[i] === ";" || src[i] === "\n") cuts.push(i);
  for (var k = 0; k < cuts.length; k++) {
    var head = src.slice(0, cuts[k] + 1), tail = src.slice(cuts[k] + 1);
    if (!tail.trim() || /^\s*(var|let|const|if|for|while|do|switch|try|throw|class)\b/.test(tail))
      continue;
    var candidate = "(function() {\n" + head + "\nreturn (" + tail + "\n);\n})";
    try { eval(candidate); return candidate; } catch (e) {}
  }
  return "(function() {\n" + src + "\n})";
}
var __cdcFunctions = [];
function __cdcDefine(code) {
  __cdcFunctions.push(eval(__cdcSource(code)));
  return __cdcFunctions.length - 1;
}
function __cdcReplace(key, value) {
  var raw = this[key];
  if (raw instanceof Date) return {$date: raw.getTime()};
  if (raw instanceof ObjectId) return {$oid: raw.str};
  if (raw === undefined) return null;
  return value;
}
function __cdcApply(n, json) {
  var args = JSON.parse(json, __cdcRevive);
  return JSON.stringify({v: __cdcFunctions[n].apply(null, args)}, __cdcReplace);
}
function __cdcAccumulate(n, state, json) {
  var pending = JSON.parse(json, __cdcRevive), fn = __cdcFunctions[n];
  state = JSON.parse(state, __cdcRevive).v;
  for (var i = 0; i < pending.length; i++) state = fn.apply(null, [state].concat(pending[i]));
  return JSON.stringify({v: state}, __cdcReplace);
}
function __cdcWhere(n, json) {
  var doc = JSON.parse(json, __cdcRevive);
  globalThis.obj = doc;
  return !!__cdcFunctions[n].call(doc);
}
"""


class _Isolate(threading.local):
    """One V8 isolate per thread, with its own compiled predicates."""

    def __init__(self) -> None:
        from py_mini_racer import MiniRacer  # V8 loads on the first $where only

        self.racer = MiniRacer()
        self.racer.eval(_PRELUDE)
        self.functions: dict[str, int] = {}
        with _RACERS_LOCK:
            _RACERS.append(self.racer)


# Every isolate made, closed at exit: one left for the interpreter's shutdown to collect
# (the main thread's, say) hangs it in V8's teardown.
_RACERS: list[Any] = []
_RACERS_LOCK = threading.Lock()


@atexit.register
def _close_isolates() -> None:
    with _RACERS_LOCK:
        racers = list(_RACERS)
        _RACERS.clear()
    for racer in racers:
        racer.close()


_ISOLATES: _Isolate | None = None
_ISOLATES_LOCK = threading.Lock()


def _isolate() -> _Isolate:
    global _ISOLATES
    if _ISOLATES is None:
        with _ISOLATES_LOCK:
            if _ISOLATES is None:
                _ISOLATES = _Isolate()
    return _ISOLATES


def _js_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return {"$date": int(value.timestamp() * 1000)}
    if isinstance(value, ObjectId):
        return {"$oid": str(value)}
    if isinstance(value, Decimal128):
        return float(value.to_decimal())
    if isinstance(value, (bytes, Binary)):
        subtype = value.subtype if isinstance(value, Binary) else 0
        return {"base64": base64.b64encode(bytes(value)).decode(), "subType": subtype}
    if isinstance(value, uuid.UUID):
        return {"base64": base64.b64encode(value.bytes).decode(), "subType": 4}
    if isinstance(value, Timestamp):
        return {"t": value.time, "i": value.inc}
    if isinstance(value, Regex):
        return {"source": value.pattern, "flags": str(value.flags)}
    return str(value)


def _document_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, default=_js_value, ensure_ascii=False, allow_nan=True)


_JS_ERROR = re.compile(r"\b(\w*Error: [^\n]*)")


def _interpreter_failure(exc: Exception) -> MongoError:
    """139 with the JavaScript error's `Name: message` (mongod adds SpiderMonkey's stack,
    which V8's differs from)."""
    found = _JS_ERROR.search(str(exc))
    return MongoError(139, found.group(1).strip() if found else type(exc).__name__)


def _define(isolate: _Isolate, code: str) -> int:
    """The isolate's function of `code` (compiled once per isolate)."""
    n = isolate.functions.get(code)
    if n is None:
        try:
            n = int(isolate.racer.call("__cdcDefine", code))
        except Exception as exc:  # noqa: BLE001 - a SyntaxError
            raise _interpreter_failure(exc) from None
        isolate.functions[code] = n
    return n


def _timeout_ms() -> float | None:
    deadline = embedded_regex.backtracking_deadline.get()
    if isinstance(deadline, float):
        return max(1.0, (deadline - time.monotonic()) * 1000)
    return None


def _run(isolate: _Isolate, name: str, *args: Any) -> Any:
    from py_mini_racer import JSTimeoutException

    try:
        return isolate.racer.call(name, *args, timeout=_timeout_ms())
    except JSTimeoutException:
        raise MongoError(50, "operation exceeded time limit") from None
    except Exception as exc:  # noqa: BLE001 - JSEvalException and its kinds
        raise _interpreter_failure(exc) from None


_EPOCH = datetime.datetime(1970, 1, 1)


def _from_js(value: Any) -> Any:
    """A JavaScript result as BSON values: a number is a double (mongod's ValueWriter), a
    Date a date, an ObjectId an ObjectId."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return [_from_js(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("$date"), (int, float)):
            return _EPOCH + datetime.timedelta(milliseconds=value["$date"])
        if len(value) == 1 and isinstance(value.get("$oid"), str):
            return ObjectId(value["$oid"])
        return {k: _from_js(v) for k, v in value.items()}
    return value


def _evaluate(parser: Any, expression: Any) -> Any:
    try:
        return parser.parse(expression)
    except KeyError:  # mongomock's missing
        return None


def function_expression(parser: Any, spec: Any) -> Any:
    """`$function` (ExpressionFunction::parse, then evaluate): `body` called with `args`."""
    if not isinstance(spec, Mapping):
        raise MongoError(31260, "$function requires an object as an argument, found: "
                         f"{type_name(spec)}")
    if "body" not in spec:
        raise MongoError(31261, "The body function must be specified.")
    body = spec["body"]
    if (isinstance(body, str) and not isinstance(body, Code) and body.startswith("$")) or (
            isinstance(body, (Mapping, list))):
        raise MongoError(31432, "The body function must be a constant expression")
    if not isinstance(body, str):
        raise MongoError(31262, "The body function must evaluate to type string or code")
    if "args" not in spec:
        raise MongoError(31263, "The args field must be specified.")
    if "lang" not in spec:
        raise MongoError(31418, "The lang field must be specified.")
    if spec["lang"] != "js":
        raise MongoError(31419, "Currently the only supported language specifier is 'js'.")
    isolate = _isolate()
    n = _define(isolate, str(body))
    args = _evaluate(parser, spec["args"])
    if isinstance(spec["args"], list):  # an array literal: each element (missing is null)
        args = [_evaluate(parser, a) for a in spec["args"]]
    if not isinstance(args, list):
        raise MongoError(31266, "The args field must be of type array")
    out = _run(isolate, "__cdcApply", n, json.dumps(args, default=_js_value, allow_nan=True))
    return _from_js(json.loads(out)["v"])


expressions.install_operator("$function", function_expression)


def _accumulator_function(field: str, value: Any) -> str:
    """AccumulatorJs's parseFunction: a constant String or Code."""
    if (isinstance(value, str) and not isinstance(value, Code) and value.startswith("$")) or (
            isinstance(value, (Mapping, list))):
        raise MongoError(4544701, f"$accumulator '{field}' must be a constant expression")
    if not isinstance(value, str):
        raise MongoError(4544702, f"$accumulator '{field}' must be a String or Code")
    return str(value)


class _JsAccumulator(accumulators.Accumulator):
    """AccumulatorJs: `init(...initArgs)` when the group starts, `accumulate(state, ...args)`
    per document (in batches, as mongod calls a JavaScript loop), `finalize(state)` at the end.
    The state crosses to Python and back as JSON, as mongod's goes through BSON."""

    def __init__(self, functions: dict[str, str], init_args: Any) -> None:
        if not isinstance(init_args, list):
            raise MongoError(4544711, "$accumulator initArgs must evaluate to an array: "
                             f"{value_string(init_args)}")
        self.functions = functions
        isolate = _isolate()
        init = _define(isolate, functions["init"])
        self.state: str = _run(isolate, "__cdcApply", init,
                               json.dumps(init_args, default=_js_value, allow_nan=True))
        self.pending: list[Any] = []

    def process(self, value: Any) -> None:
        if not isinstance(value, list):
            raise MongoError(4544712, "$accumulator accumulateArgs must evaluate to an array: "
                             f"{value_string(value)}")
        self.pending.append(value)

    def _reduce(self) -> None:
        if self.pending:
            isolate = _isolate()
            n = _define(isolate, self.functions["accumulate"])
            self.state = _run(isolate, "__cdcAccumulate", n, self.state,
                              json.dumps(self.pending, default=_js_value, allow_nan=True))
            self.pending = []

    def result(self) -> Any:
        self._reduce()
        finalize = self.functions.get("finalize")
        if finalize is None:
            return _from_js(json.loads(self.state)["v"])
        isolate = _isolate()
        n = _define(isolate, finalize)
        state = json.loads(self.state)["v"]
        out = _run(isolate, "__cdcApply", n, json.dumps([state], allow_nan=True))
        return _from_js(json.loads(out)["v"])


def accumulator_parse(arg: Any) -> accumulators.Parsed:
    """AccumulatorJs::parse: its fields in any order, then the required ones checked."""
    if not isinstance(arg, Mapping):
        raise MongoError(4544703, "$accumulator expects an object as an argument; found: "
                         f"{type_name(arg)}")
    functions: dict[str, str] = {}
    init_args: Any = []
    accumulate_args: Any = None
    for name, value in arg.items():
        if name in ("init", "accumulate", "merge", "finalize"):
            functions[name] = _accumulator_function(name, value)
        elif name == "initArgs":
            init_args = value
        elif name == "accumulateArgs":
            accumulate_args = value
        elif name == "lang":
            if not isinstance(value, str):
                raise MongoError(4544704, "$accumulator lang must be a string; found: "
                                 f"{type_name(value)}")
            if value != "js":
                raise MongoError(4544705, "$accumulator only supports lang: 'js'")
        else:
            raise MongoError(4544706, f"$accumulator got an unexpected field: {name}")
    for required, code in (("init", 4544707), ("accumulate", 4544708), ("merge", 4544709)):
        if not functions.get(required):
            raise MongoError(code, f"$accumulator missing required argument '{required}'")
    if accumulate_args is None:
        raise MongoError(4544710, "$accumulator missing required argument 'accumulateArgs'")
    return (lambda evaluated: _JsAccumulator(functions, evaluated)), accumulate_args, init_args


accumulators.install("$accumulator", accumulator_parse)


class WherePredicate:
    """A parsed `$where`: called with a document, whether it matches."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __bool__(self) -> bool:  # mongomock tests a logical operator's operand for emptiness
        return True

    def __call__(self, doc: Mapping[str, Any]) -> bool:
        isolate = _isolate()
        n = _define(isolate, self.code)
        return bool(_run(isolate, "__cdcWhere", n, _document_json(doc)))


def parse_where(value: Any) -> WherePredicate:
    """ExtensionsCallback::extractWhereMatchExpressionParams: a string or Code without scope."""
    if isinstance(value, Code) and value.scope is not None:
        raise MongoError(4649201, "$where no longer supports deprecated BSON type CodeWScope")
    if not isinstance(value, str):
        raise MongoError(2, "$where got bad type")
    if not value:
        raise MongoError(2, "code for $where cannot be empty")
    return WherePredicate(str(value))


def compile_where(filter_doc: Mapping[str, Any]) -> dict[str, Any]:
    """`filter_doc` with each `$where` (top level, or in `$and` / `$or` / `$nor` clauses, where
    mongod takes it) parsed into a WherePredicate."""
    out: dict[str, Any] = {}
    for key, value in filter_doc.items():
        if key == "$where":
            out[key] = parse_where(value)
        elif key in ("$and", "$or", "$nor") and isinstance(value, list):
            out[key] = [compile_where(c) if isinstance(c, Mapping) else c for c in value]
        else:
            out[key] = value
    return out


def has_where(compiled: Mapping[str, Any]) -> bool:
    for key, value in compiled.items():
        if isinstance(value, WherePredicate):
            return True
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            if any(isinstance(c, Mapping) and has_where(c) for c in value):
                return True
    return False

