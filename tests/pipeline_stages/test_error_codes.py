"""The error-code table generated from mongod's error_codes.yml, the names cdcserver gives the
codes it raises, and the error-label policy beside the table."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipeline_stages import error_codes, error_labels
from pipeline_stages.errors import CODE_NAMES, MongoError, code_name

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "pipeline_stages" / "error_codes.py"


def _generator() -> ModuleType:
    path = ROOT / "tools" / "gen_error_codes.py"
    spec = importlib.util.spec_from_file_location("gen_error_codes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


# Entries as error_codes.yml lists them (code, codeName, categories).
WELL_KNOWN = [
    (0, "OK", ()),
    (1, "InternalError", ()),
    (6, "HostUnreachable", ("NetworkError", "RetriableError")),
    (43, "CursorNotFound", ("CursorInvalidatedError",)),
    (50, "MaxTimeMSExpired", ("Interruption", "ExceededTimeLimitError")),
    (89, "NetworkTimeout", ("NetworkError", "RetriableError", "NetworkTimeoutError")),
    (91, "ShutdownInProgress", ("ShutdownError", "CancellationError", "RetriableError")),
    (136, "CappedPositionLost", ()),
    (234, "RetryChangeStream", ()),
    (260, "InvalidResumeToken", ()),
    (280, "ChangeStreamFatalError", ("NonResumableChangeStreamError",)),
    (286, "ChangeStreamHistoryLost", ("NonResumableChangeStreamError",)),
    (288, "ChecksumMismatch", ("ConnectionFatalMessageParseError",)),
    (10107, "NotWritablePrimary", ("NotPrimaryError", "RetriableError")),
    (10334, "BSONObjectTooLarge", ()),
    (11000, "DuplicateKey", ()),
    (11600, "InterruptedAtShutdown",
     ("Interruption", "ShutdownError", "CancellationError", "RetriableError")),
    (13388, "StaleConfig", ("StaleShardVersionError", "NeedRetargettingError")),
]


@pytest.mark.parametrize(("code", "name", "categories"), WELL_KNOWN)
def test_generated_table_has_the_ymls_entries(code: int, name: str, categories: tuple) -> None:
    assert error_codes.ERROR_CODES[code] == name
    assert error_codes.CODE_CATEGORIES.get(code, ()) == categories
    for category in error_codes.CATEGORY_NAMES:
        assert (code in error_codes.CATEGORIES[category]) == (category in categories)


def test_generated_table_is_whole_and_consistent() -> None:
    table = error_codes.ERROR_CODES
    assert len(table) > 450  # every code of the yml, not a selection
    assert len(set(table.values())) == len(table)  # one name per code
    assert 131 not in table  # commented out in the yml (removed in 4.2)
    for code, cats in error_codes.CODE_CATEGORIES.items():
        assert code in table and cats and set(cats) <= set(error_codes.CATEGORY_NAMES)
    assert set(error_codes.CATEGORIES) == set(error_codes.CATEGORY_NAMES)


def _yml_from_table() -> str:
    """The committed table written back in error_codes.yml's format."""
    lines = ["error_categories:"] + [f"  - {c}" for c in error_codes.CATEGORY_NAMES]
    lines += ["", "error_codes:"]
    for code, name in error_codes.ERROR_CODES.items():
        cats = error_codes.CODE_CATEGORIES.get(code)
        if cats:
            lines += ["  - {", f"      code: {code},", f"      name: {name},",
                      f"      categories: [{', '.join(cats)}],", "    }"]
        else:
            lines.append(f"  - {{code: {code}, name: {name}}}")
    return "\n".join(lines) + "\n"


def test_committed_module_is_the_generators_output() -> None:
    gen = _generator()
    categories, codes = gen.parse(_yml_from_table())
    assert gen.render(categories, codes, error_codes.SOURCE) == GENERATED.read_text()


def test_generator_reads_the_ymls_forms(tmp_path: Path) -> None:
    gen = _generator()
    yml = tmp_path / "error_codes.yml"
    yml.write_text(
        "# Group related errors into categories\n"
        "error_categories:\n"
        "  - NetworkError\n"
        "  # a comment between categories\n"
        "  - RetriableError\n"
        "\n"
        "error_codes:\n"
        "  - {code: 0, name: OK}\n"
        "  - {code: 6, name: HostUnreachable, categories: [NetworkError, RetriableError]}\n"
        "  #- {code: 131,name: RLPInitializationFailed} # Removed in 4.2\n"
        "  - {\n"
        "      code: 91,\n"
        "      name: ShutdownInProgress,\n"
        "      extra: ShutdownInProgressQuiesceInfo,\n"
        "      categories:\n"
        "        [RetriableError],\n"
        "      extraIsOptional: True,\n"
        "    }\n"
        '  - {code: 121,name: DocumentValidationFailure, extra: "a::b::Info"}\n'
        "  - {code: 275, name: ExchangePassthrough} # Do not reuse.\n"
    )
    out = tmp_path / "error_codes.py"
    assert gen.main([str(yml), "--source", "test", "--output", str(out)]) == 0
    namespace: dict[str, object] = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)  # noqa: S102 (our own output)
    assert namespace["ERROR_CODES"] == {
        0: "OK", 6: "HostUnreachable", 91: "ShutdownInProgress",
        121: "DocumentValidationFailure", 275: "ExchangePassthrough",
    }
    assert namespace["CODE_CATEGORIES"] == {
        6: ("NetworkError", "RetriableError"), 91: ("RetriableError",),
    }
    assert namespace["CATEGORIES"] == {
        "NetworkError": frozenset({6}), "RetriableError": frozenset({6, 91}),
    }


@pytest.mark.parametrize("body", [
    "error_categories:\n  - A\nerror_codes:\n  - {code: 1, name: X}\n  - {code: 1, name: Y}\n",
    "error_categories:\n  - A\nerror_codes:\n  - {code: 1, name: X, categories: [B]}\n",
    "error_categories:\n  - A\nerror_codes:\n  - {name: X}\n",
    "error_codes:\n  - {code: 1, name: X}\n",
])
def test_generator_refuses_a_malformed_yml(body: str) -> None:
    with pytest.raises(ValueError):
        _generator().parse(body)


# -- the names cdcserver gives the codes it raises ------------------------------------------------

# Codes mongod 8.0 reports as Location<code> although the (master) yml names them.
NAMED_AFTER_8_0 = error_codes.CATEGORIES["IDLParseError"]


def _raised_codes() -> dict[int, set[str]]:
    """Every literal code passed to an error constructor in cdcserver/ and pipeline_stages/:
    `SomeError(<code>, ...)`, `...(code=<code>)`, and `{"code": <code>, ...}` replies."""
    found: dict[int, set[str]] = {}

    def add(node: ast.AST | None, where: str) -> None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            found.setdefault(node.value, set()).add(where)

    for package in ("cdcserver", "pipeline_stages"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.id if isinstance(func, ast.Name) else (
                        func.attr if isinstance(func, ast.Attribute) else "")
                    if name.endswith("Error") and node.args:
                        add(node.args[0], where)
                    for kw in node.keywords:
                        if kw.arg == "code":
                            add(kw.value, where)
                elif isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values):
                        if isinstance(key, ast.Constant) and key.value == "code":
                            add(value, where)
    return found


def test_the_scan_finds_the_codes_the_project_raises() -> None:
    raised = _raised_codes()
    # a sample from different layers: pipeline, embedded store, commands, wire, sources
    for code in (2, 9, 14, 26, 50, 260, 280, 286, 11000, 22, 40415, 50811):
        assert code in raised, code


def test_every_code_the_project_raises_has_its_mongod_name() -> None:
    wrong = {}
    for code, where in sorted(_raised_codes().items()):
        if code in error_codes.ERROR_CODES and code not in NAMED_AFTER_8_0:
            expected = error_codes.ERROR_CODES[code]
        else:
            expected = f"Location{code}"
        if code_name(code) != expected or MongoError(code, "x").to_reply()["codeName"] != expected:
            wrong[code] = (code_name(code), expected, sorted(where))
    assert not wrong


def test_every_name_is_mongods() -> None:
    """cdcserver names every code as the table does, except the IDL parse codes mongod 8.0
    still reports as Location<code>."""
    differing = {c for c, n in CODE_NAMES.items() if error_codes.ERROR_CODES.get(c) != n}
    assert differing == set()
    assert set(error_codes.ERROR_CODES) - set(CODE_NAMES) == NAMED_AFTER_8_0
    assert {code_name(c) for c in NAMED_AFTER_8_0} == {f"Location{c}" for c in NAMED_AFTER_8_0}


def test_literal_code_names_match_the_table() -> None:
    """Where a module names a code itself (the wire layer does: it imports nothing above it),
    the name is mongod's."""
    pairs = []
    for path in sorted((ROOT / "cdcserver").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                kws = {kw.arg: kw.value for kw in node.keywords}
                code, name = kws.get("code"), kws.get("code_name")
                if isinstance(code, ast.Constant) and isinstance(name, ast.Constant):
                    pairs.append((code.value, name.value, path.name))
    assert pairs  # wire/_bson.py names 22, 10334, 15
    for code, name, where in pairs:
        assert error_codes.ERROR_CODES[code] == name, (code, name, where)


# -- the error-label policy ------------------------------------------------------------------------

# The 8.0 sets cdcserver has always used (commands/failpoints.py before the table).
LABEL_SETS_8_0 = {
    "NETWORK_ERROR": {6, 7, 89, 317, 384, 9001},
    "RETRIABLE_ERROR": {6, 7, 89, 91, 134, 189, 262, 317, 358, 384, 402, 9001, 10107, 11600,
                        11602, 13435, 13436, 50915},
    "NEED_RETARGETTING_ERROR": {150, 13388},
    "NOT_PRIMARY_ERROR": {189, 10107, 11602, 13435, 13436},
    "SNAPSHOT_ERROR": {239, 246, 250, 272},
    "NON_RESUMABLE_CHANGE_STREAM_ERROR": {280, 286},
}


@pytest.mark.parametrize(("name", "codes"), LABEL_SETS_8_0.items())
def test_label_sets_come_from_the_table_unchanged(name: str, codes: set[int]) -> None:
    assert getattr(error_labels, name) == codes


def test_resumable_change_stream_codes() -> None:
    assert error_labels.RESUMABLE_CHANGE_STREAM_CODES == (
        LABEL_SETS_8_0["RETRIABLE_ERROR"] | LABEL_SETS_8_0["NETWORK_ERROR"]
        | LABEL_SETS_8_0["NEED_RETARGETTING_ERROR"] | {133, 234}
    )
    assert not error_labels.RESUMABLE_CHANGE_STREAM_CODES & {43, 280, 286}


TXN = {"txnNumber": 1, "autocommit": False}


@pytest.mark.parametrize(("name", "cmd", "code", "wc_code", "change_stream", "labels"), [
    # a retryable write failing with a retriable error
    ("insert", {"txnNumber": 1}, 91, None, False, ["RetryableWriteError"]),
    ("insert", {"txnNumber": 1}, None, 64, False, []),
    ("insert", {"txnNumber": 1}, None, 91, False, ["RetryableWriteError"]),
    ("insert", {}, 91, None, False, []),  # not a retryable write
    # statements of a transaction
    ("insert", TXN, 112, None, False, ["TransientTransactionError"]),
    ("find", TXN, 6, None, False, ["TransientTransactionError"]),
    ("find", TXN, 251, None, False, ["TransientTransactionError"]),
    ("find", TXN, 358, None, False, []),
    ("commitTransaction", TXN, 251, None, False, ["TransientTransactionError"]),
    ("commitTransaction", TXN, 91, None, False, ["RetryableWriteError"]),
    ("commitTransaction", TXN, 251, 64, False, []),
    # change streams
    ("aggregate", {}, 6, None, True, ["ResumableChangeStreamError"]),
    ("getMore", {}, 234, None, True, ["ResumableChangeStreamError"]),
    ("getMore", {}, 43, None, True, []),
    ("aggregate", {}, 6, None, False, []),
    ("getMore", {}, 286, None, True, ["NonResumableChangeStreamError"]),
    ("find", {}, 280, None, False, ["NonResumableChangeStreamError"]),
])
def test_error_labels(name: str, cmd: dict, code: int | None, wc_code: int | None,
                      change_stream: bool, labels: list[str]) -> None:
    assert error_labels.error_labels(
        name, cmd, code, wc_code, change_stream=change_stream
    ) == labels


def test_internal_clients_get_no_retryable_write_label() -> None:
    assert error_labels.error_labels("insert", {"txnNumber": 1}, 91, internal_client=True) == []
