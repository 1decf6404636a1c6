"""Dotted field paths (`"a.b.c"`) in documents: the one place they are read and written.

The functions differ in what a path may cross, and their names say it:

- `document_value`, `has_document_path`, `set_document_value`: embedded documents only (an
  array, or any other value, on the way ends the path);
- `has_path_with_positions`: embedded documents and array positions (a numeric part indexes
  an array).

(The embedded store's update operators walk paths with mongod's update rules and errors, in
`cdcserver/embedded/modifiers.py`; the multi-valued traversals, where a path fans out over
an array's elements, follow each one's own mongod rule next to their callers.)

Used by cdcserver/ and pipeline_stages/ alike: this module imports neither.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any


def document_value(doc: Any, path: str, default: Any) -> Any:
    """The value at `path` through embedded documents; `default` when a part is absent or
    what it is looked up in is not a document."""
    value = doc
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return default
        value = value[part]
    return value


def has_document_path(doc: Any, path: str) -> bool:
    """Whether `path` exists through embedded documents (a field holding null counts)."""
    node = doc
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def has_path_with_positions(doc: Any, path: str) -> bool:
    """Whether `path` exists through embedded documents and array positions (`"a.0.b"`: the
    first element of array `a`)."""
    node = doc
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def set_document_value(doc: dict[str, Any], path: str, value: Any) -> None:
    """Store `value` at `path`, through embedded documents: a part that is absent or holds
    anything but a document becomes a new (empty, order-sensitive) document."""
    parts = path.split(".")
    for part in parts[:-1]:
        sub = doc.get(part)
        if not isinstance(sub, dict):
            sub = doc[part] = OrderedDict()
        doc = sub
    doc[parts[-1]] = value
