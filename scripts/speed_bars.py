"""Check a saved benchmark (``bench --json``) against the speed bars of the speed issue.

Bars, per policy, over the Kimi-K3 shapes:
  1. batch 1..64: time <= (weight + activation bytes) / 4.4 TB/s + 2 us;
  2. batch 1..64: faster than torch.matmul in every cell, geometric mean >= 1.3x;
  3. batch 1..64, weights of 50 MB or more: at least 4.2 TB/s;
  4. batch 96..256: no more than 5% slower than torch.matmul.
Prints every cell that misses and a count per bar.

    python scripts/speed_bars.py docs/measurements/<date>-bench-h200.json
"""

import argparse
import json
import math
from collections import defaultdict

STREAMING_BATCHES = (1, 2, 3, 4, 8, 16, 24, 32, 48, 64)
COMPUTE_BATCHES = (96, 128, 192, 256)
BYTES_PER_US = 4.4e6
SLACK_US = 2.0


def floor_us(cell):
    """The bar-1 limit: weight and activation bytes at 4.4 TB/s plus 2 us."""
    n, k, m = cell["n"], cell["k"], cell["batch"]
    return (n * k + m * k) * 2 / BYTES_PER_US + SLACK_US


def misses(cells):
    """{bar: [message]} for one policy's cells."""
    found = defaultdict(list)
    streaming = [c for c in cells if c["batch"] in STREAMING_BATCHES]
    for c in streaming:
        where = f"{c['n']}x{c['k']} M={c['batch']}"
        if c["us"] > floor_us(c):
            found[1].append(f"{where}: {c['us']:.2f} us > {floor_us(c):.2f}")
        if c["us"] >= c["cublas_us"]:
            found[2].append(f"{where}: {c['us']:.2f} us >= torch.matmul {c['cublas_us']:.2f}")
        if c["n"] * c["k"] * 2 >= 50e6 and c["n"] * c["k"] * 2 / c["us"] / 1e6 < 4.2:
            found[3].append(f"{where}: {c['n'] * c['k'] * 2 / c['us'] / 1e6:.2f} TB/s < 4.2")
    geomean = math.exp(sum(math.log(c["cublas_us"] / c["us"]) for c in streaming) / max(len(streaming), 1))
    if geomean < 1.3:
        found[2].append(f"geometric mean {geomean:.3f}x < 1.3x")
    for c in cells:
        if c["batch"] in COMPUTE_BATCHES and c["us"] > 1.05 * c["cublas_us"]:
            found[4].append(f"{c['n']}x{c['k']} M={c['batch']}: {c['us']:.2f} us > 1.05 x {c['cublas_us']:.2f}")
    return found, geomean, len(streaming)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json")
    parser.add_argument("--quiet", action="store_true", help="counts only")
    args = parser.parse_args()
    with open(args.bench_json) as f:
        cells = json.load(f)["cells"]
    for policy in sorted({c["policy"] for c in cells}):
        found, geomean, streaming = misses([c for c in cells if c["policy"] == policy])
        counts = ", ".join(f"bar {bar}: {len(found[bar])}" for bar in (1, 2, 3, 4))
        print(f"{policy}: geomean {geomean:.3f}x over {streaming} cells at M<=64; misses {counts}")
        if not args.quiet:
            for bar in (1, 2, 3, 4):
                for line in found[bar]:
                    print(f"  bar {bar}  {line}")


if __name__ == "__main__":
    main()
