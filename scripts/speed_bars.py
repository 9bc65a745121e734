"""Check a saved benchmark (``bench --json``) against the speed bars of the speed issue.

Bars, per policy, over the Kimi-K3 shapes:
  1. batch 1..64: time <= (weight + activation bytes) / 4.4 TB/s + 2 us;
  2. batch 1..64: faster than torch.matmul in every cell, geometric mean >= 1.3x;
  3. batch 1..64, weights of 50 MB or more: at least 4.2 TB/s;
  4. batch 96..256: no more than 5% slower than torch.matmul.
The batch-invariant policy may also run up to 10% over the tuned one at batch
1..64, cell by cell in the same run. Prints every cell that misses and a count
per bar; exits 1 if any bar is missed.

Given several runs, each cell is judged on its median time and torch.matmul's
median time over the runs (one run varies by about 0.5% in the geometric mean,
which is as close as bar 2 has come to 1.3x), and each run's geometric mean is
printed too.

Bars 1 and 3 are absolute figures for the H200's HBM: runs on another GPU (the ``gpu`` of each run's metadata)
are judged on bars 2 and 4 and the batch-invariant allowance only, and say so. Runs of different GPUs are
refused: their medians would mean nothing.

    python scripts/speed_bars.py docs/measurements/<date>-bench-h200.json [more runs ...]
"""

import argparse
import math
import statistics
from collections import defaultdict

from decode_projection.report import read_document
from decode_projection.tune import INVARIANT_EXCESS  # batch-invariant over tuned time, per cell, M <= 64

BARS_GPU = "NVIDIA H200"  # bars 1 and 3 are this GPU's figures
LAST_STREAMING_BATCH = 64  # bars 1-3 hold up to here, bar 4 above
BYTES_PER_US = 4.4e6  # bar 1: bytes at 4.4 TB/s ...
SLACK_US = 2.0  # ... plus 2 us
LEAST_SPEEDUP = 1.3  # bar 2: geometric mean over torch.matmul
LARGE_WEIGHT_BYTES = 50e6  # bar 3: weights this large ...
LEAST_TBPS = 4.2  # ... stream at least this fast
COMPUTE_BOUND_SLACK = 1.05  # bar 4: at most this much over torch.matmul


def bar1_limit_us(cell):
    """The bar-1 limit: weight and activation bytes at 4.4 TB/s plus 2 us."""
    n, k, m = cell["n"], cell["k"], cell["batch"]
    return (n * k + m * k) * 2 / BYTES_PER_US + SLACK_US


def misses(cells, *, absolute=True):
    """``({bar: [cell that misses]}, geometric mean at streaming batches or None, streaming cells)``; without
    ``absolute``, bars 1 and 3 (the H200's figures) are not judged."""
    found = defaultdict(list)
    streaming = [c for c in cells if c["batch"] <= LAST_STREAMING_BATCH]
    for c in streaming:
        where = f"{c['n']}x{c['k']} M={c['batch']}"
        if absolute and c["us"] > bar1_limit_us(c):
            found[1].append(f"{where}: {c['us']:.2f} us > {bar1_limit_us(c):.2f}")
        if c["us"] >= c["cublas_us"]:
            found[2].append(f"{where}: {c['us']:.2f} us >= torch.matmul {c['cublas_us']:.2f}")
        tbps = c["n"] * c["k"] * 2 / c["us"] / 1e6
        if absolute and c["n"] * c["k"] * 2 >= LARGE_WEIGHT_BYTES and tbps < LEAST_TBPS:
            found[3].append(f"{where}: {tbps:.2f} TB/s < {LEAST_TBPS}")
    geomean = None
    if streaming:
        geomean = math.exp(sum(math.log(c["cublas_us"] / c["us"]) for c in streaming) / len(streaming))
    for c in cells:
        if c["batch"] > LAST_STREAMING_BATCH and c["us"] > COMPUTE_BOUND_SLACK * c["cublas_us"]:
            found[4].append(f"{c['n']}x{c['k']} M={c['batch']}: {c['us']:.2f} us > "
                            f"{COMPUTE_BOUND_SLACK} x {c['cublas_us']:.2f}")
    return found, geomean, len(streaming)


def invariant_excess(cells):
    """The streaming cells where the batch-invariant policy runs more than INVARIANT_EXCESS x the tuned one."""
    tuned = {(c["n"], c["k"], c["batch"]): c["us"] for c in cells if c["policy"] == "tuned"}
    return [
        f"{c['n']}x{c['k']} M={c['batch']}: {c['us']:.2f} us = {c['us'] / free:.2f} x tuned {free:.2f}"
        for c in cells
        if c["policy"] == "batch-invariant" and c["batch"] <= LAST_STREAMING_BATCH
        and (free := tuned.get((c["n"], c["k"], c["batch"]))) is not None and c["us"] > INVARIANT_EXCESS * free
    ]


def combined(runs):
    """One cell per (policy, shape, batch) of several runs' cells: the median of ours and of torch.matmul."""
    grouped = defaultdict(list)
    for cells in runs:
        for c in cells:
            grouped[c["policy"], c["n"], c["k"], c["batch"]].append(c)
    return [
        dict(found[0], us=statistics.median(c["us"] for c in found),
             cublas_us=statistics.median(c["cublas_us"] for c in found))
        for found in grouped.values()
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", nargs="+", help="one or more runs (bench --json)")
    parser.add_argument("--quiet", action="store_true", help="counts only")
    args = parser.parse_args()
    documents = [read_document(path) for path in args.bench_json]
    gpus = {document.get("meta", {}).get("gpu") for document in documents}
    if len(gpus) > 1:
        parser.error(f"the runs come from different GPUs ({', '.join(sorted(map(str, gpus)))}): judge each alone")
    (gpu,) = gpus
    absolute = gpu == BARS_GPU
    if not absolute:
        print(f"bars 1 and 3 are the {BARS_GPU}'s figures; these runs are on {gpu}: not judged")
    runs = [document["cells"] for document in documents]
    if len(runs) > 1:
        for path, cells in zip(args.bench_json, runs):
            for policy in sorted({c["policy"] for c in cells}):
                _, geomean, _ = misses([c for c in cells if c["policy"] == policy], absolute=absolute)
                if geomean is not None:
                    print(f"{path}: {policy} geometric mean at M<=64 {geomean:.3f}x")
        print(f"cells judged on their medians over {len(runs)} runs:")
    cells = combined(runs) if len(runs) > 1 else runs[0]
    missed = False
    for policy in sorted({c["policy"] for c in cells}):
        found, geomean, streaming = misses([c for c in cells if c["policy"] == policy], absolute=absolute)
        judged = (1, 2, 3, 4) if absolute else (2, 4)
        counts = ", ".join(f"bar {bar}: {len(found[bar])} cells" for bar in judged)
        short = geomean is not None and geomean < LEAST_SPEEDUP
        mean = "no cells" if geomean is None else f"{geomean:.3f}x"
        mean += f" (< {LEAST_SPEEDUP}x: misses bar 2)" if short else ""
        print(f"{policy}: geometric mean at M<=64 {mean} over {streaming} cells; misses {counts}")
        missed |= any(found.values()) or short
        if not args.quiet:
            for bar in judged:
                for line in found[bar]:
                    print(f"  bar {bar}  {line}")
    over = invariant_excess(cells)
    if over:
        print(f"batch-invariant: {len(over)} cells at M<=64 more than {INVARIANT_EXCESS - 1:.0%} over tuned")
        missed = True
        for line in ([] if args.quiet else over):
            print(f"  over  {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
