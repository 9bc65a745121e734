"""Merge two tuned tables by benchmark: per cell the tactic that measured faster.

The tuner can only pick among its candidates, and two tuning runs draw different
candidate lists; a cell that one run missed the other may have found. Both runs'
benchmark JSONs time every cell of their table, so the faster tactic per cell,
by the geometric mean over the launch contexts timed of its mean time in each
(the tuner's own score), goes into the merged table. A batch-invariant table keeps
one summation order per shape, so it takes whole shapes: the run whose cells of
that shape sum to less. Re-run the benchmark on the merged table before quoting
its numbers (picking the minimum of two noisy runs flatters both).

Each table is followed by its benchmark JSONs: one of all launch contexts, or
older ones of one context each (back to back, ``--isolated``):

    python scripts/merge_tables.py A.json A-bench.json B.json B-bench.json --out merged.json
    python scripts/merge_tables.py A.json A-bench.json A-bench-isolated.json \
        B.json B-bench.json B-bench-isolated.json --out merged.json
"""

import argparse
import json
from collections import defaultdict

from decode_projection.report import document_cells, read_document
from decode_projection.tactic import stored_tactic
from decode_projection.tables import load_table, write_table
from decode_projection.timing import geometric_mean


def bench_scores(paths, policy, table):
    """{(n, k, batch): the tuner's score} for the cells where ``policy`` ran ``table``'s own tactic (not a
    heuristic fallback, not another table's) in the benchmark JSONs at ``paths``."""
    tactics = {(e["n"], e["k"], e["batch"]): stored_tactic(e["tactic"]) for e in table["entries"]}
    times = defaultdict(lambda: defaultdict(list))  # (n, k, batch): {context: [us]}
    for path in paths:
        for cell in document_cells(read_document(path)):
            key = cell["n"], cell["k"], cell["batch"]
            ran = stored_tactic(cell["tactic"])
            if cell["policy"] == policy and cell["source"] == "table" and tactics.get(key) == ran:
                times[key][cell["context"]].append(cell["us"])
    return {key: geometric_mean(sum(us) / len(us) for us in by_context.values()) for key, by_context in times.items()}


def runs_of(paths):
    """``[(table path, [benchmark paths])]``: each table file (a JSON document with entries) and the files after it."""
    runs = []
    for path in paths:
        document = read_document(path)
        if isinstance(document, dict) and "entries" in document:
            runs.append((path, []))
        elif not runs:
            raise SystemExit(f"{path}: the first file must be a table, its benchmarks after it")
        else:
            runs[-1][1].append(path)
    if len(runs) != 2 or not all(benches for _, benches in runs):
        raise SystemExit(f"two tables, each followed by its benchmark JSONs, expected; got {len(runs)} tables")
    return runs


def merge(tables, scores, batch_invariant):
    """``(entries, [how many came from each table])``: per cell (per shape when batch-invariant)
    the faster table's entry; a cell or shape only one table has comes from that one."""
    entries = [{(e["n"], e["k"], e["batch"]): e for e in table["entries"]} for table in tables]
    cells = sorted(set(entries[0]) | set(entries[1]))
    slow = float("inf")

    def faster(group):
        """The table whose entries for ``group`` exist and sum to less time."""
        totals = [sum(score.get(cell, slow) for cell in group) if all(c in found for c in group) else slow
                  for score, found in zip(scores, entries)]
        if totals[0] == totals[1] == slow:  # unmeasured in both: keep the table that has them all
            return 0 if all(cell in entries[0] for cell in group) else 1
        return totals.index(min(totals))

    groups = ([[cell for cell in cells if cell[:2] == shape] for shape in sorted({cell[:2] for cell in cells})]
              if batch_invariant else [[cell] for cell in cells])
    merged, counts = [], [0, 0]
    for group in groups:
        run = faster(group)
        merged += [entries[run][cell] for cell in group]
        counts[run] += len(group)
    return merged, counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="table A, its benchmark JSONs, table B, its benchmark JSONs")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    runs = runs_of(args.files)
    tables = [read_document(path) for path, _ in runs]
    # Cells are matched by shape and batch: every entry must share one GPU, its dtypes and one mode.
    kinds = {(e["gpu"], e["sm_count"], e["weight_dtype"], e["output_dtype"], e["batch_invariant"])
             for table in tables for e in table["entries"]}
    if len(kinds) != 1:
        raise SystemExit("both tables must hold entries of one GPU, dtype pair and mode (batch-invariant or not), "
                         f"found {sorted(kinds, key=str) or 'none'}")
    invariant = kinds.pop()[-1]
    policy = "batch-invariant" if invariant else "tuned"
    scores = [bench_scores(benches, policy, table) for (_, benches), table in zip(runs, tables)]
    entries, counts = merge(tables, scores, invariant)
    write_table(args.out, entries, dsl_version=tables[1].get("cutlass_dsl"), measured=tables[1].get("measured"))
    load_table(args.out)  # the merged table must load: valid tactics, one summation order per invariant shape
    print(f"{len(entries)} entries: {counts[0]} from {runs[0][0]}, {counts[1]} from {runs[1][0]}")


if __name__ == "__main__":
    main()
