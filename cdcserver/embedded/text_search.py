"""`$text` queries over a collection's text index: which documents match and their textScore.

As mongod's FTS (fts_spec.cpp, fts_matcher.cpp): the indexed strings are split into terms on
non-letters, lowercased, English stop words dropped and each term stemmed; a document matches
when it holds any of the query's terms, every quoted phrase (case-insensitively) and none of
the negated terms. Its score sums, over the query's terms, the weighted score of the term in
each indexed field (FTSSpec::_scoreStringV2: repeated occurrences count less, a field made of
only the term gets a small boost). The stemmer is a small suffix stripper, not Snowball: it
stems the query and the documents alike, so matching is consistent, but a few words stem
differently than on mongod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

# mongod's stop_words_english.txt.
STOP_WORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before
being below between both but by can't cannot could couldn't did didn't do does doesn't doing
don't down during each few for from further had hadn't has hasn't have haven't having he he'd
he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in
into is isn't it it's its itself let's me more most mustn't my myself no nor not of off on
once only or other ought our ours ourselves out over own same shan't she she'd she'll she's
should shouldn't so some such than that that's the their theirs them themselves then there
there's these they they'd they'll they're they've this those through to too under until up
very was wasn't we we'd we'll we're we've were weren't what what's when when's where where's
which while who who's whom why why's with won't would wouldn't you you'd you'll you're you've
your yours yourself yourselves
""".split())

_TOKEN = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")
_SUFFIXES = ("ational", "iveness", "fulness", "ousness", "ization", "ations", "ingly",
             "ation", "ement", "ness", "ment", "ings", "edly", "ing", "ies", "ied", "ed",
             "es", "ly", "s")


_DOUBLES = frozenset({"bb", "dd", "ff", "gg", "mm", "nn", "pp", "rr", "tt"})


def stem(term: str) -> str:
    """A light English suffix stripper (keeps at least three letters; `ss` stays)."""
    for suffix in _SUFFIXES:
        if term.endswith(suffix) and len(term) - len(suffix) >= 3:
            if suffix == "s" and term.endswith(("ss", "us", "is")):
                return term
            base = term[: -len(suffix)]
            if suffix in ("ies", "ied"):
                return base + "i"
            if suffix in ("ing", "ed") and base[-2:] in _DOUBLES:  # running -> run (Snowball)
                return base[:-1]
            return base
    return term


def _cased_terms(text: str, language: str) -> list[str]:
    """Terms as written ($caseSensitive: FTSMatcher compares the unlowered, stemmed terms)."""
    words = _TOKEN.findall(text)
    if language == "none":
        return words
    return [stem(w) for w in words if w.lower() not in STOP_WORDS]


def terms(text: str, language: str = "english") -> list[str]:
    """The index terms of a string, in order (stop words dropped, stemmed)."""
    words = [w.lower() for w in _TOKEN.findall(text)]
    if language == "none":
        return words
    return [stem(w) for w in words if w not in STOP_WORDS]


@dataclass
class TextQuery:
    """A parsed `$text: {$search, $language, $caseSensitive, $diacriticSensitive}`."""

    terms: set[str] = field(default_factory=set)
    negated: set[str] = field(default_factory=set)
    phrases: list[str] = field(default_factory=list)
    negated_phrases: list[str] = field(default_factory=list)
    case_sensitive: bool = False
    cased: set[str] = field(default_factory=set)  # the positive words as written, stemmed


def _extract(spec: Mapping[str, Any], name: str, kind: type, kind_name: str) -> Any:
    """bsonExtractTypedField: 4 when missing (None here for the optional ones), 14 when of
    another type."""
    if name not in spec:
        return None
    value = spec[name]
    if not isinstance(value, kind) or (kind is str and isinstance(value, bool)):
        raise MongoError(14, f'"{name}" had the wrong type. Expected {kind_name}, found '
                         f"{type_name(value)}")
    return value


def parse(spec: Any, default_language: str) -> TextQuery:
    """mongod's parse errors for a `$text` argument
    (ExtensionsCallback::extractTextMatchExpressionParams), then the query's terms."""
    if not isinstance(spec, Mapping):
        raise MongoError(2, "$text expects an object")
    search = _extract(spec, "$search", str, "string")
    if search is None:
        raise MongoError(4, 'Missing expected field "$search"')
    language = _extract(spec, "$language", str, "string")
    case_sensitive = _extract(spec, "$caseSensitive", bool, "bool")
    diacritic = _extract(spec, "$diacriticSensitive", bool, "bool")
    expected = 1 + sum(v is not None for v in (language, case_sensitive, diacritic))
    if len(spec) != expected:
        raise MongoError(2, "extra fields in $text")
    language = language or default_language
    q = TextQuery(case_sensitive=bool(case_sensitive))
    # Quoted phrases (a leading '-' negates one), then the remaining words.
    for m in re.finditer(r'(-?)"([^"]*)"', search):
        (q.negated_phrases if m.group(1) else q.phrases).append(m.group(2))
    rest = re.sub(r'-?"[^"]*"', " ", search)
    for word in rest.split():
        negate = word.startswith("-")
        target = q.negated if negate else q.terms
        target.update(terms(word.lstrip("-"), language))
        if not negate:
            q.cased.update(_cased_terms(word, language))
    for phrase in q.phrases:  # a phrase's words are search terms too
        q.terms.update(terms(phrase, language))
    return q


def _strings(doc: Any, path: list[str]) -> list[str]:
    if not path:
        if isinstance(doc, str):
            return [doc]
        if isinstance(doc, list):
            return [s for v in doc for s in _strings(v, [])]
        return []
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v, path)]
    if isinstance(doc, Mapping) and path[0] in doc:
        return _strings(doc[path[0]], path[1:])
    return []


def _all_strings(doc: Any) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, Mapping):
        return [s for v in doc.values() for s in _all_strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _all_strings(v)]
    return []


def _field_scores(text: str, weight: float, language: str, out: dict[str, float]) -> None:
    """FTSSpec::_scoreStringV2 for one string, added into `out` (term -> score)."""
    counts: dict[str, list[float]] = {}  # term -> [exp, count, freq]
    n = 0
    for term in terms(text, language):
        data = counts.setdefault(term, [0.0, 0.0, 0.0])
        data[0] = data[0] * 2 if data[0] else 1.0
        data[1] += 1
        data[2] += 1 / data[0]
        n += 1
    for term, (_, count, freq) in counts.items():
        coeff = 0.5 * count / n + 0.5
        adjustment = 1.1 if len(text) == len(term) and text.lower() == term else 1.0
        out[term] = out.get(term, 0.0) + weight * freq * coeff * adjustment


def text_index(indexes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The collection's text index, else 27 (a $text query needs one)."""
    for ix in indexes:
        if ix.get("key", {}).get("_fts") == "text":
            return ix
    raise MongoError(27, "text index required for $text query")


def score(index: Mapping[str, Any], q: TextQuery, doc: Mapping[str, Any]) -> float | None:
    """The document's textScore, or None when it does not match the query."""
    language = index.get("default_language", "english")
    override = doc.get(index.get("language_override", "language"))
    if isinstance(override, str):
        language = override
    weights = index.get("weights", {})
    scores: dict[str, float] = {}
    raw: list[str] = []
    for path, weight in weights.items():
        found = _all_strings(doc) if path == "$**" else _strings(doc, path.split("."))
        for text in found:
            raw.append(text)
            _field_scores(text, float(weight), language, scores)
    if not q.terms or not any(t in scores for t in q.terms):
        return None
    if any(t in scores for t in q.negated):
        return None

    def contains(phrase: str) -> bool:
        if q.case_sensitive:
            return any(phrase in text for text in raw)
        return any(phrase.lower() in text.lower() for text in raw)

    if q.case_sensitive and not any(
            t in q.cased for text in raw for t in _cased_terms(text, language)):
        return None
    if not all(contains(p) for p in q.phrases) or any(contains(p) for p in q.negated_phrases):
        return None
    return sum(scores.get(t, 0.0) for t in q.terms)
