"""Check saved benchmarks (``bench --json``) against the speed issue's bars, launch context by launch context.

Bars, per policy and launch context (chain, pdl-glue, glue), over the Kimi-K3 shapes:
  1. batch 1..64: time <= max(bytes / 4.4 TB/s + 1.5 us, read ceiling + 0.3 us) in chain and pdl-glue,
     max(bytes / 4.4 TB/s + 2.2 us, read ceiling + 0.5 us) after glue, where bytes are the weight's and the
     activations' and the read ceiling is the one measured in the same context and run;
  2. batch 1..64: faster than torch.matmul in every cell, and a geometric-mean speedup of at least 1.35x in chain
     and pdl-glue, 1.22x after glue;
  3. batch 1..64, weights of 50 MB or more, chain and pdl-glue: at least 4.2 TB/s;
  4. batch 96..256: no cell more than 5% slower than torch.matmul.
The batch-invariant policy may also run up to 10% over the tuned one at batch
1..64, cell by cell in the same context and run. Prints every cell that misses
and a count per bar; exits 1 if any bar is missed. Per context it also prints
what the read ceiling's times in place of ours would reach over torch.matmul:
how far bar 2 lies from streaming the weight alone.

The bars are judged on medians of at least three runs: each cell on its median
time, torch.matmul's and the read ceiling's over the runs (one run varies by
about 0.5% in the geometric mean); each run's geometric means are printed too.
``--fewer-runs`` judges fewer, as a look rather than a verdict.

The figures of bytes at 4.4 TB/s and of bar 3 are the H200's HBM: runs on
another GPU (the ``gpu`` of each run's metadata) are judged on bar 1 by the read
ceiling of the same run only, not on bar 3, and say so. In place of bar 3
they are judged on the card bar (the H100 issue's): in chain at batch 1..64,
time <= the weight's and activations' bytes at the read ceiling's rate + 2.0
us, the rate being the fastest the read ceiling streamed a weight of 50 MB or
more back to back in the same runs. Runs of different GPUs are refused: their
medians would mean nothing.

    python scripts/speed_bars.py docs/measurements/<date>-bench-h200-{1,2,3}.json
"""

import argparse
from collections import defaultdict

from decode_projection.measure.report import document_cells, median_cells, read_document
from decode_projection.measure.timing import geometric_mean
from decode_projection.policy.workload import LAST_STREAMING_BATCH  # bars 1-3 hold up to here, bar 4 above
from decode_projection.tuning.tune import INVARIANT_EXCESS  # batch-invariant over tuned time, per cell, M <= 64

BARS_GPU = "NVIDIA H200"  # the bytes-per-second figures of bars 1 and 3 are this GPU's
LEAST_RUNS = 3  # the bars hold for medians of this many runs
BYTES_PER_US = 4.4e6  # bar 1: bytes at 4.4 TB/s ...
SLACK_US = {"chain": 1.5, "pdl-glue": 1.5, "glue": 2.2}  # ... plus this, by context ...
CEILING_SLACK_US = {"chain": 0.3, "pdl-glue": 0.3, "glue": 0.5}  # ... or the read ceiling plus this
LEAST_SPEEDUP = {"chain": 1.35, "pdl-glue": 1.35, "glue": 1.22}  # bar 2: geometric mean over torch.matmul
LARGE_WEIGHT_BYTES = 50e6  # bar 3: weights this large ...
LEAST_TBPS = 4.2  # ... stream at least this fast ...
STREAMING_CONTEXTS = ("chain", "pdl-glue")  # ... in these contexts
COMPUTE_BOUND_SLACK = 1.05  # bar 4: at most this much over torch.matmul
CARD_SLACK_US = 2.0  # card bar, off the H200: bytes at the run's own read ceiling plus this, in chain


def bar1_limit_us(cell, *, absolute=True):
    """The bar-1 limit of a cell, or None where there is none to judge by (no ceiling, off the H200)."""
    n, k, m, context = cell["n"], cell["k"], cell["batch"], cell["context"]
    limits = [(n * k + m * k) * 2 / BYTES_PER_US + SLACK_US[context]] if absolute else []
    if cell.get("ceiling_us") is not None:
        limits.append(cell["ceiling_us"] + CEILING_SLACK_US[context])
    return max(limits, default=None)


def streaming(cells):
    """The cells at streaming batches (bars 1-3), M <= LAST_STREAMING_BATCH."""
    return [c for c in cells if c["batch"] <= LAST_STREAMING_BATCH]


def misses(cells, *, absolute=True):
    """``({bar: [cell that misses]}, geometric mean at streaming batches or None, streaming cells)`` of the cells of
    one policy in one context; without ``absolute`` (off the H200) bar 1 is judged by the read ceiling alone and
    bar 3 not at all."""
    found = defaultdict(list)
    streaming_cells = streaming(cells)
    for c in streaming_cells:
        where = f"{c['n']}x{c['k']} M={c['batch']}"
        limit = bar1_limit_us(c, absolute=absolute)
        if limit is not None and c["us"] > limit:
            found[1].append(f"{where}: {c['us']:.2f} us > {limit:.2f}")
        if c["us"] >= c["cublas_us"]:
            found[2].append(f"{where}: {c['us']:.2f} us >= torch.matmul {c['cublas_us']:.2f}")
        tbps = c["n"] * c["k"] * 2 / c["us"] / 1e6
        if (absolute and c["context"] in STREAMING_CONTEXTS and c["n"] * c["k"] * 2 >= LARGE_WEIGHT_BYTES
                and tbps < LEAST_TBPS):
            found[3].append(f"{where}: {tbps:.2f} TB/s < {LEAST_TBPS}")
    geomean = geometric_mean(c["cublas_us"] / c["us"] for c in streaming_cells) if streaming_cells else None
    for c in cells:
        if c["batch"] > LAST_STREAMING_BATCH and c["us"] > COMPUTE_BOUND_SLACK * c["cublas_us"]:
            found[4].append(f"{c['n']}x{c['k']} M={c['batch']}: {c['us']:.2f} us > "
                            f"{COMPUTE_BOUND_SLACK} x {c['cublas_us']:.2f}")
    return found, geomean, len(streaming_cells)


def read_ceiling_bytes_per_us(cells):
    """The fastest rate, in bytes per us, at which the read ceiling streamed a weight of LARGE_WEIGHT_BYTES or more
    back to back among the cells, or None where no such chain cell has a ceiling (small weights' rates are mostly
    start-up, and would make the card bar lax)."""
    rates = [c["n"] * c["k"] * 2 / c["ceiling_us"] for c in cells
             if c["context"] == "chain" and c.get("ceiling_us") and c["n"] * c["k"] * 2 >= LARGE_WEIGHT_BYTES]
    return max(rates, default=None)


def card_limit_us(cell, bytes_per_us):
    """The card bar's limit of a cell: its weight's and activations' bytes at ``bytes_per_us`` plus CARD_SLACK_US."""
    return (cell["n"] * cell["k"] + cell["batch"] * cell["k"]) * 2 / bytes_per_us + CARD_SLACK_US


def card_bar_misses(cells, bytes_per_us):
    """The cells of one policy in chain at streaming batches over their card_limit_us."""
    limits = [(c, card_limit_us(c, bytes_per_us)) for c in streaming(cells) if c["context"] == "chain"]
    return [f"{c['n']}x{c['k']} M={c['batch']}: {c['us']:.2f} us > {limit:.2f}"
            for c, limit in limits if c["us"] > limit]


def ceiling_speedup(cells):
    """The geometric mean over torch.matmul at streaming batches of a kernel that only read the weight: the read
    ceiling's time in place of ours, or None where a cell has no ceiling. What bar 2 could reach by streaming
    alone, with no start-up, compute or stores of its own."""
    streaming_cells = streaming(cells)
    if not streaming_cells or any(c.get("ceiling_us") is None for c in streaming_cells):
        return None
    return geometric_mean(c["cublas_us"] / c["ceiling_us"] for c in streaming_cells)


def invariant_excess(cells):
    """The streaming cells where the batch-invariant policy runs more than INVARIANT_EXCESS x the tuned one in the
    same context."""
    tuned = {(c["context"], c["n"], c["k"], c["batch"]): c["us"] for c in cells if c["policy"] == "tuned"}
    return [
        f"{c['context']} {c['n']}x{c['k']} M={c['batch']}: {c['us']:.2f} us = {c['us'] / free:.2f} x tuned {free:.2f}"
        for c in cells
        if c["policy"] == "batch-invariant" and c["batch"] <= LAST_STREAMING_BATCH
        and (free := tuned.get((c["context"], c["n"], c["k"], c["batch"]))) is not None
        and c["us"] > INVARIANT_EXCESS * free
    ]


def groups(cells):
    """``{(policy, context): cells}`` in the order of the contexts' first cells, policies sorted."""
    found = defaultdict(list)
    for c in cells:
        found[c["policy"], c["context"]].append(c)
    contexts = list(dict.fromkeys(c["context"] for c in cells))
    return {key: found[key] for key in sorted(found, key=lambda key: (contexts.index(key[1]), key[0]))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", nargs="+", help=f"at least {LEAST_RUNS} runs (bench --json)")
    parser.add_argument("--fewer-runs", action="store_true", help=f"judge fewer than {LEAST_RUNS} runs (no verdict)")
    parser.add_argument("--quiet", action="store_true", help="counts only")
    args = parser.parse_args()
    if len(args.bench_json) < LEAST_RUNS and not args.fewer_runs:
        parser.error(f"the bars are judged on medians of at least {LEAST_RUNS} runs, got {len(args.bench_json)} "
                     "(--fewer-runs for a look)")
    documents = [read_document(path) for path in args.bench_json]
    gpus = {document.get("meta", {}).get("gpu") for document in documents}
    if len(gpus) > 1:
        parser.error(f"the runs come from different GPUs ({', '.join(sorted(map(str, gpus)))}): judge each alone")
    (gpu,) = gpus
    absolute = gpu == BARS_GPU
    if not absolute:
        print(f"bytes at 4.4 TB/s (bars 1 and 3) are the {BARS_GPU}'s figures; these runs are on {gpu}: bar 1 judged "
              "by the read ceiling of each run alone, bar 3 not judged")
    if len(documents) < LEAST_RUNS:
        print(f"{len(documents)} runs, fewer than {LEAST_RUNS}: a look, not a verdict")
    runs = [document_cells(document) for document in documents]
    if len(runs) > 1:
        for path, cells in zip(args.bench_json, runs):
            for (policy, context), found in groups(cells).items():
                _, geomean, _ = misses(found, absolute=absolute)
                if geomean is not None:
                    print(f"{path}: {policy} {context} geometric mean at M<=64 {geomean:.3f}x")
        print(f"cells judged on their medians over {len(runs)} runs:")
    cells = median_cells(runs) if len(runs) > 1 else runs[0]
    missed = False
    judged = (1, 2, 3, 4) if absolute else (1, 2, 4)
    headroom_shown = set()
    for (policy, context), found_cells in groups(cells).items():
        if context not in headroom_shown and (reachable := ceiling_speedup(found_cells)) is not None:
            headroom_shown.add(context)
            print(f"{context}: the read ceiling in place of ours would be {reachable:.3f}x over torch.matmul "
                  f"at M<={LAST_STREAMING_BATCH} (bar 2 wants {LEAST_SPEEDUP[context]}x)")
        found, geomean, streaming_count = misses(found_cells, absolute=absolute)
        counts = ", ".join(f"bar {bar}: {len(found[bar])} cells" for bar in judged)
        least = LEAST_SPEEDUP[context]
        short = geomean is not None and geomean < least
        mean = "no cells" if geomean is None else f"{geomean:.3f}x"
        mean += f" (< {least}x: misses bar 2)" if short else ""
        print(f"{policy} {context}: geometric mean at M<=64 {mean} over {streaming_count} cells; misses {counts}")
        missed |= any(found.values()) or short
        if not args.quiet:
            for bar in judged:
                for line in found[bar]:
                    print(f"  bar {bar}  {line}")
    rate = None if absolute else read_ceiling_bytes_per_us(cells)
    if not absolute and rate is None:
        print(f"card bar not judged: no weight of {LARGE_WEIGHT_BYTES / 1e6:.0f} MB or more has a read ceiling "
              "back to back in these runs")
    for (policy, context), found_cells in groups(cells).items():
        if rate is not None and context == "chain":
            found = card_bar_misses(found_cells, rate)
            print(f"{policy} chain, card bar: time <= bytes / {rate / 1e6:.3f} TB/s (this read ceiling) + "
                  f"{CARD_SLACK_US} us at M<={LAST_STREAMING_BATCH}: misses {len(found)} cells")
            missed |= bool(found)
            for line in ([] if args.quiet else found):
                print(f"  card  {line}")
    over = invariant_excess(cells)
    if over:
        print(f"batch-invariant: {len(over)} cells at M<=64 more than {INVARIANT_EXCESS - 1:.0%} over tuned")
        missed = True
        for line in ([] if args.quiet else over):
            print(f"  over  {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
