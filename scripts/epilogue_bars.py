"""Check saved epilogue benchmarks (``bench --epilogue ... --json``) against the epilogue issue's bars.

Per shape, batch up to 64 (the issue's M = 1..64; larger batches are counted apart, as a look), epilogue and launch
context, on each provider's median over the runs (at least three):
  1. the fused form costs at most 0.3 us more than the plain projection of the same shape;
  2. the fused form beats the projection followed by the separate op;
  3. the residual's fused form beats torch.addmm.
Prints every cell that misses and a count per bar; exits 1 if any bar is missed at M <= 64 (under three runs: a
look, not a verdict, exit 0).

    python scripts/epilogue_bars.py epilogues-1.json epilogues-2.json epilogues-3.json  (or .json.gz)
"""

import argparse
import statistics
import sys
from collections import defaultdict

from decode_projection.measure.report import read_document
from decode_projection.policy.workload import LAST_STREAMING_BATCH  # the bars hold up to here

LEAST_RUNS = 3
FUSED_EXTRA_US = 0.3  # bar 1
FIELDS = ("plain_us", "fused_us", "separate_us", "torch_us")


def medians(runs) -> dict:
    """``{(n, k, batch, epilogue, context): {field: median us}}`` over the runs' cells (``torch_us`` may be None)."""
    timed = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for cell in run["cells"]:
            key = (cell["n"], cell["k"], cell["batch"], cell["epilogue"], cell["context"])
            for field in FIELDS:
                if cell.get(field) is not None:
                    timed[key][field].append(cell[field])
    return {key: {field: statistics.median(values) for field, values in fields.items()}
            for key, fields in timed.items()}


def misses(cells) -> list[tuple[int, str]]:
    """``[(bar, line)]`` for every cell that misses a bar."""
    found = []
    for (n, k, batch, epilogue, context), us in sorted(cells.items()):
        where = f"{n}x{k} M={batch} {epilogue} {context}"
        if us["fused_us"] > us["plain_us"] + FUSED_EXTRA_US:
            found.append((1, f"{where}: fused {us['fused_us']:.2f} us > plain {us['plain_us']:.2f} + "
                             f"{FUSED_EXTRA_US}"))
        if us["fused_us"] >= us["separate_us"]:
            found.append((2, f"{where}: fused {us['fused_us']:.2f} us >= separate {us['separate_us']:.2f}"))
        if epilogue == "residual" and "torch_us" in us and us["fused_us"] >= us["torch_us"]:
            found.append((3, f"{where}: fused {us['fused_us']:.2f} us >= torch.addmm {us['torch_us']:.2f}"))
    return found


def counts(found) -> str:
    """'misses bar 1: a, bar 2: b, bar 3: c' of ``[(bar, line)]``."""
    per_bar = {bar: sum(1 for b, _ in found if b == bar) for bar in (1, 2, 3)}
    return f"misses bar 1: {per_bar[1]}, bar 2: {per_bar[2]}, bar 3: {per_bar[3]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="bench --epilogue --json files of one GPU")
    args = parser.parse_args(argv)
    runs = [read_document(path) for path in args.runs]
    gpus = {run.get("gpu") for run in runs}
    if len(gpus) > 1:
        parser.error(f"runs of different GPUs: {sorted(map(str, gpus))}")
    gpu = gpus.pop()
    cells = medians(runs)
    judged = misses({key: us for key, us in cells.items() if key[2] <= LAST_STREAMING_BATCH})
    larger = {key: us for key, us in cells.items() if key[2] > LAST_STREAMING_BATCH}
    beyond = misses(larger)
    for bar, line in judged:
        print(f"bar {bar}  {line}")
    verdict = "a look, not a verdict" if len(runs) < LEAST_RUNS else "medians"
    print(f"{gpu}, {len(runs)} run(s) ({verdict}), M <= {LAST_STREAMING_BATCH}: {counts(judged)}")
    if larger:
        for bar, line in beyond:
            print(f"  beyond the bars: bar {bar}  {line}")
        print(f"{gpu}, M > {LAST_STREAMING_BATCH} (beyond the bars, a look): {counts(beyond)}")
    return 1 if judged and len(runs) >= LEAST_RUNS else 0


if __name__ == "__main__":
    sys.exit(main())
