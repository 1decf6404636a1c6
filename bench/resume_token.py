"""Resume-token codec throughput against `bson.encode` of the same documentKeys, same run.

Prints tokens/s for encoding (event parts -> `{_data[, _typeBits]}`: through
`ResumeTokenData`, and through `event_token`, the path the transform takes per event) and
decoding (`{_data}` -> ResumeTokenData, as a resume does), for ObjectId and string
`_id`s, and the ratio of each to bson.encode/s of the bare documentKey (the limit: one C call
that serializes the same key). Ratio 1.0 = as fast as bson.encode; the issue's aim is encode
ratio >= 1/3.
"""

from __future__ import annotations

import argparse
import os
import time

import bson
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from pipeline_stages import resume_token as rt


def rates(fns, items, repeat: int) -> list[float]:
    """Best-of-`repeat` rate of each fn, the fns interleaved so load affects all alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for k, (fn, xs) in enumerate(zip(fns, items)):
            t0 = time.perf_counter()
            for x in xs:
                fn(x)
            best[k] = min(best[k], time.perf_counter() - t0)
    return [len(xs) / b for xs, b in zip(items, best)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    uuid = os.urandom(16)
    kinds = {
        "ObjectId _id": [{"_id": ObjectId()} for _ in range(args.n)],
        "string _id": [{"_id": f"user-{i:08d}@example.com"} for i in range(args.n)],
    }
    print(f"{'documentKey':<14} {'bson.encode/s':>14} {'encode/s':>12} {'ratio':>6} "
          f"{'per-event/s':>12} {'ratio':>6} {'decode/s':>12} {'ratio':>6}")
    for name, keys in kinds.items():
        raws = [bson.encode(k) for k in keys]

        def encode(raw: bytes, ts=Timestamp(1700000000, 1)) -> dict:
            return rt.ResumeTokenData.for_event(
                ts, "insert", uuid=uuid, document_key=raw
            ).to_document()

        def per_event(raw: bytes, ts=Timestamp(1700000000, 1)) -> dict:
            return rt.event_token(ts, "insert", uuid, raw)  # what the transform calls

        tokens = [encode(r) for r in raws]
        assert tokens == [per_event(r) for r in raws]
        limit, enc, fast, dec = rates(
            [bson.encode, encode, per_event, rt.decode], [keys, raws, raws, tokens], args.repeat
        )
        print(f"{name:<14} {limit:>14,.0f} {enc:>12,.0f} {enc / limit:>6.2f} "
              f"{fast:>12,.0f} {fast / limit:>6.2f} {dec:>12,.0f} {dec / limit:>6.2f}")


if __name__ == "__main__":
    main()
