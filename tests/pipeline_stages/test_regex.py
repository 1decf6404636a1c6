"""`$regex` split along the layer boundary: pipeline_stages/regex.py (pure: MongoDB semantics,
RE2 translation, an in-process fallback by default) and cdcserver/embedded/regex.py (the
worker-process fallback of the embedded store's offloaded scans).

The end-to-end behaviour through a server (PCRE meaning, parse errors, maxTimeMS on a
backtracking match) is tests/embedded/test_query_limits.py's; these check the parts and the seam.
"""

from __future__ import annotations

import contextvars
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bson.regex import Regex

from cdcserver.embedded import regex as embedded
from pipeline_stages import oplog_match
from pipeline_stages import regex as pure
from pipeline_stages.errors import MongoError

ROOT = Path(__file__).resolve().parents[2]

# (pattern, options, text, matches) under PCRE2 as mongod runs it
CASES = [
    ("^abc$", "", "abc\n", True),  # PCRE's $ also matches before a final newline
    ("^abc$", "", "abc\nx", False),
    ("^abc$", "m", "x\nabc\ny", True),
    ("^a.c$", "s", "a\nc", True),
    ("^a.c$", "", "a\nc", False),
    ("^a b c  # the letters\n$", "x", "abc", True),
    ("^ABC$", "i", "abc", True),
    ("^a{,2}$", "", "a{,2}", True),  # PCRE2 reads {,2} literally
    ("^a{,2}$", "", "aa", False),
    (r"^(a)\1$", "", "aa", True),  # backreference: not RE2
    (r"^(a)\1$", "", "ab", False),
    ("^a(?=b)", "", "ab", True),  # lookahead: not RE2
    ("^a(?=b)", "", "ac", False),
    (r"^x(?=a{,2})", "", "xa{,2}", True),  # fallback gets the Python spelling of `{`
]


@pytest.mark.parametrize(("pattern", "options", "text", "matches"), CASES)
def test_both_fallbacks_mean_what_pcre_means(pattern: str, options: str, text: str,
                                             matches: bool) -> None:
    flt = {"s": {"$regex": pattern, "$options": options}}
    for compiled in (pure.compile_filter(flt), embedded.compile_filter(flt)):
        operand = compiled["s"]["$regex"]
        assert isinstance(operand, pure.MatchRegex)
        assert operand == Regex(pattern, options)  # still the BSON regex it was made from
        assert bool(operand.matcher.search(text)) is matches


def test_linear_patterns_never_reach_the_fallback() -> None:
    seen: list[tuple[str, int]] = []

    class Recording(pure.PythonMatcher):
        def __init__(self, pattern: str, flags: int) -> None:
            seen.append((pattern, flags))
            super().__init__(pattern, flags)

    linear = pure.compile_regex("^(a+)+$", "i", Recording)
    assert pure.is_linear(linear) and seen == []
    assert linear.search("A" * 64) and not linear.search("a" * 63 + "b")
    backtracking = pure.compile_regex("^(a+)+(?=b)b{,1}", "im", Recording)
    assert isinstance(backtracking, Recording) and not pure.is_linear(backtracking)
    assert seen == [("^(a+)+(?=b)b\\{,1}", re.IGNORECASE | re.MULTILINE)]
    assert backtracking.search("AAb{,1}")
    # compiled once per (pattern, options, fallback)
    assert pure.compile_regex("^(a+)+(?=b)b{,1}", "im", Recording) is backtracking
    assert len(seen) == 1


def test_the_default_fallback_is_in_process_python_re() -> None:
    matcher = pure.compile_regex(r"(a)\1")
    assert type(matcher) is pure.PythonMatcher
    assert matcher.search("xaa") and not matcher.search("xa")


def test_the_embedded_fallback_uses_a_worker_only_in_an_offloaded_scan() -> None:
    flt = {"s": {"$regex": r"^(a)\1$"}}
    matcher = embedded.compile_filter(flt)["s"]["$regex"].matcher
    assert not pure.is_linear(matcher)
    assert type(matcher) is not type(pure.compile_filter(flt)["s"]["$regex"].matcher)
    before = embedded.stats["offloaded"]
    assert matcher.search("aa") and not matcher.search("ab")
    assert embedded.stats["offloaded"] == before  # in-process: no scan set a deadline

    def offloaded() -> list[bool]:  # what query.py's _run_offloaded sets in its thread
        embedded.backtracking_deadline.set(None)
        return [bool(matcher.search("aa")), bool(matcher.search("ab"))]

    assert contextvars.copy_context().run(offloaded) == [True, False]
    assert embedded.stats["offloaded"] == before + 2
    assert matcher.search("aa") and embedded.stats["offloaded"] == before + 2


@pytest.mark.parametrize(("flt", "code", "message"), [
    ({"s": {"$regex": "a", "$options": "g"}}, 51108, " invalid flag in regex options: g"),
    ({"s": {"$regex": "a("}}, 51091, "Regular expression is invalid: "),
    ({"s": {"$regex": r"(?<=a+)b"}}, 51091, "Regular expression is invalid: "),
    ({"s": {"$regex": Regex("a", "i"), "$options": "m"}}, 51075,
     "options set in both $regex and $options"),
    ({"s": {"$options": "m", "$regex": Regex("a", "i")}}, 51074,
     "options set in both $regex and $options"),
    ({"s": {"$regex": "a", "$options": 1}}, 2, "$options has to be a string"),
    ({"s": {"$regex": "a\0"}}, 2, "Regular expression cannot contain an embedded null byte"),
    ({"$or": [{"s": {"$elemMatch": {"$regex": "(", "$options": ""}}}]}, 51091,
     "Regular expression is invalid: "),
])
@pytest.mark.parametrize("compile_filter", [pure.compile_filter, embedded.compile_filter])
def test_parse_errors_are_mongods(compile_filter: Any, flt: dict[str, Any], code: int,
                                  message: str) -> None:
    with pytest.raises(MongoError) as err:
        compile_filter(flt)
    assert err.value.code == code
    assert message in str(err.value)


def test_options_fold_into_the_regex() -> None:
    compiled = pure.compile_filter({"s": {"$regex": re.compile("^a"), "$options": "im"},
                                    "t": {"$in": [Regex("^b", "s"), 1]}})
    assert compiled["s"] == {"$regex": Regex("^a", re.I | re.M)}
    assert compiled["s"]["$regex"].options == "im"
    assert compiled["s"]["$regex"].matcher.search("x\nA")
    assert pure.options_of(compiled["t"]["$in"][0]) == "s"
    assert compiled["t"]["$in"][1] == 1


def test_the_python_spelling_has_one_definition() -> None:
    assert oplog_match.python_pattern is pure.python_pattern
    assert pure.python_pattern("a{,2}{3}{4,}{5,6}\\{") == "a\\{,2}{3}{4,}{5,6}\\{"
    assert pure.to_re2("a{,2}$", False, False) == "a\\{,2}(?:\\n?\\z)"
    assert pure.to_re2("a$b", False, False) is None  # `$` mid-pattern: the fallback's


def test_the_pure_module_imports_no_io() -> None:
    """Importing pipeline_stages/regex.py (and user_stages.py, its $match user) brings in no
    cdcserver module, no subprocess/asyncio/socket."""
    code = (
        "import sys\n"
        "import pipeline_stages.regex\n"
        "bad = {'subprocess', 'asyncio', 'socket'} & set(sys.modules)\n"
        "import pipeline_stages.user_stages\n"
        "bad |= {m for m in sys.modules if m.split('.')[0] == 'cdcserver'}\n"
        "print(sorted(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"
