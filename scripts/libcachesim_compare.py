#!/usr/bin/env python3
"""Replay an oracleGeneral trace through PyPI `libcachesim` (the peer simulator) and print
one JSON line per (policy, cache size): miss ratio, byte miss ratio, requests and the
seconds `process_trace` took (C++ replay loop; reader setup excluded).

Used by `kaiso bench sim` and the kaiso-sim validation test. Installs nothing itself:
run `python3 -m pip install libcachesim` first (the callers do). Exit code 3 means the
module is not importable.

usage: libcachesim_compare.py TRACE.oracleGeneral --sizes 1000,10000 --policies lru,arc
       (sizes in bytes; with --object-size S the cache holds size/S objects of S bytes)
"""
import argparse
import json
import sys
import time

# kaiso policy name -> libcachesim class name
NAMES = {
    "fifo": "FIFO",
    "lru": "LRU",
    "clock": "Clock",
    "arc": "ARC",
    "twoq": "TwoQ",
    "lirs": "LIRS",
    "s3fifo": "S3FIFO",
    "sieve": "Sieve",
    "belady": "Belady",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--sizes", required=True, help="comma-separated cache sizes in bytes")
    ap.add_argument("--policies", default=",".join(NAMES))
    ap.add_argument("--repeat", type=int, default=1, help="runs per point; the fastest is reported")
    args = ap.parse_args()
    try:
        import libcachesim as lcs
    except ImportError as e:
        print(f"libcachesim is not importable: {e}", file=sys.stderr)
        sys.exit(3)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        cls_name = NAMES.get(name)
        if cls_name is None or not hasattr(lcs, cls_name):
            print(json.dumps({"policy": name, "unsupported": True}), flush=True)
            continue
        for size in sizes:
            best = None
            for _ in range(max(1, args.repeat)):
                reader = lcs.TraceReader(args.trace, lcs.TraceType.ORACLE_GENERAL_TRACE)
                n = reader.get_num_of_req()
                cache = getattr(lcs, cls_name)(cache_size=size)
                t0 = time.perf_counter()
                miss, byte_miss = cache.process_trace(reader)
                dt = time.perf_counter() - t0
                if best is None or dt < best[2]:
                    best = (miss, byte_miss, dt, n)
            miss, byte_miss, dt, n = best
            print(json.dumps({
                "policy": name,
                "size": size,
                "miss_ratio": miss,
                "byte_miss_ratio": byte_miss,
                "requests": n,
                "seconds": dt,
            }), flush=True)


if __name__ == "__main__":
    main()
