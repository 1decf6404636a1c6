"""Pieces the end-to-end benchmarks share: the document they write, and percentiles."""

from __future__ import annotations

import statistics


def document(i: int) -> dict:
    """A ~300-byte user document with nested and array fields."""
    return {
        "_id": i,
        "name": f"user{i}",
        "email": f"user{i}@example.com",
        "n": i % 100,
        "score": i * 0.5,
        "tags": ["alpha", "beta", "gamma"],
        "address": {"street": f"{i} Main St", "city": "Springfield", "zip": f"{i % 99999:05d}"},
        "pad": "x" * 120,
    }


def p50_p99(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
