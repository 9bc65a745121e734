"""Early trigger (E) against its plain twin, in two sets of recorded tune timings: how a kernel change moved each.

For every cell (batch <= 64) and tactic the tuner timed both with and without the early trigger
(``dependents_at_start``) in both sets, the median over those pairs of (after - before), per shape and launch
context, for the E tactic and for its plain twin. Two sets timed on different lent cards shift both alike; what
the change did to the early trigger is the difference between the two columns.

    python scripts/early_trigger_pairs.py --before <tune timings> --after <tune timings> [...]
"""

import argparse
import statistics

from decode_projection.measure.report import read_document
from decode_projection.policy.workload import LAST_STREAMING_BATCH
from decode_projection.tuning.tune import row_times

CONTEXTS = ("chain", "pdl-glue", "glue")


def twins(paths) -> dict:
    """``{(n, k, batch, tactic without the flag): ({context: E us}, {context: plain us})}`` over the timings files
    (later files replace earlier ones' cells)."""
    found = {}
    for path in paths:
        for cell in read_document(path):
            if cell["batch"] > LAST_STREAMING_BATCH:
                continue
            timed = {}
            for tactic, us in row_times(cell):
                plain = tuple(sorted((field, value) for field, value in tactic.items()
                                     if field != "dependents_at_start"))
                timed[plain, tactic["dependents_at_start"]] = us
            for (plain, early), us in timed.items():
                if early and (plain, False) in timed:
                    found[cell["n"], cell["k"], cell["batch"], plain] = (us, timed[plain, False])
    return found


def shifts(before: dict, after: dict) -> dict:
    """``{(n, k): (pairs, {context: (median E shift, median plain shift)})}`` over the pairs timed in both sets."""
    result = {}
    for shape in sorted({key[:2] for key in after}):
        common = [key for key in after if key[:2] == shape and key in before]
        contexts = [c for c in CONTEXTS if all(c in after[k][0] and c in before[k][0] for k in common)]
        if not common or not contexts:
            continue
        result[shape] = (len(common), {
            context: tuple(statistics.median(after[k][side][context] - before[k][side][context] for k in common)
                           for side in (0, 1))
            for context in contexts
        })
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", required=True, help="tune --timings files of the first kernel")
    parser.add_argument("--after", nargs="+", required=True, help="tune --timings files of the second kernel")
    args = parser.parse_args(argv)
    found = shifts(twins(args.before), twins(args.after))
    print("median after - before, us: E / plain, per launch context")
    for (n, k), (count, by_context) in found.items():
        cells = "   ".join(f"{context} {e:+.2f} / {p:+.2f}" for context, (e, p) in by_context.items())
        print(f"{n}x{k}: {count} pairs   {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
