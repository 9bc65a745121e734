"""Merge two tuned tables by benchmark: per cell the tactic that measured faster.

The tuner can only pick among its candidates, and two tuning runs draw different
candidate lists; a cell that one run missed the other may have found. Both runs'
benchmark JSONs (back to back and ``--isolated``) time every cell of their
table, so the faster tactic per cell, by the mean of the two contexts (the
tuner's own score), goes into the merged table. A batch-invariant table keeps
one summation order per shape, so it takes whole shapes: the run whose cells of
that shape sum to less. Re-run the benchmark on the merged table before quoting
its numbers (picking the minimum of two noisy runs flatters both).

    python scripts/merge_tables.py A.json A-bench.json A-bench-isolated.json \
        B.json B-bench.json B-bench-isolated.json --out merged.json
"""

import argparse
import json
from collections import defaultdict


def bench_scores(back_to_back, isolated, policy):
    """{(n, k, batch): mean microseconds of the two contexts} for ``policy``'s cells."""
    times = defaultdict(list)
    for path in (back_to_back, isolated):
        with open(path) as f:
            for cell in json.load(f)["cells"]:
                if cell["policy"] == policy:
                    times[cell["n"], cell["k"], cell["batch"]].append(cell["us"])
    return {key: sum(us) / len(us) for key, us in times.items()}


def merge(tables, scores, batch_invariant):
    """The merged table's entries: per cell (or per shape, batch-invariant) the faster run's."""
    entries = [{(e["n"], e["k"], e["batch"]): e for e in table["entries"]} for table in tables]
    cells = sorted(set(entries[0]) & set(entries[1]))
    if batch_invariant:
        shapes = sorted({cell[:2] for cell in cells})
        merged = []
        for shape in shapes:
            mine = [cell for cell in cells if cell[:2] == shape]
            totals = [sum(score.get(cell, float("inf")) for cell in mine) for score in scores]
            run = totals.index(min(totals))
            merged += [entries[run][cell] for cell in mine]
        return merged
    faster = {cell: min((0, 1), key=lambda run: scores[run].get(cell, float("inf"))) for cell in cells}
    return [entries[faster[cell]][cell] for cell in cells]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for run in ("a", "b"):
        parser.add_argument(f"table_{run}")
        parser.add_argument(f"bench_{run}")
        parser.add_argument(f"isolated_{run}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tables = []
    for run in ("a", "b"):
        with open(getattr(args, f"table_{run}")) as f:
            tables.append(json.load(f))
    invariant = tables[0]["entries"][0]["batch_invariant"]
    policy = "batch-invariant" if invariant else "tuned"
    scores = [bench_scores(getattr(args, f"bench_{run}"), getattr(args, f"isolated_{run}"), policy) for run in ("a", "b")]
    merged = dict(tables[1], entries=merge(tables, scores, invariant))
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
    picked_b = sum(e in tables[1]["entries"] for e in merged["entries"])
    print(f"{len(merged['entries'])} entries: {len(merged['entries']) - picked_b} from {args.table_a}, {picked_b} from {args.table_b}")


if __name__ == "__main__":
    main()
