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

from decode_projection.report import read_document
from decode_projection.tactic import stored_tactic
from decode_projection.tables import load_table, write_table


def bench_scores(back_to_back, isolated, policy, table):
    """{(n, k, batch): mean microseconds of the two contexts} for the cells where ``policy``
    ran ``table``'s own tactic (not a heuristic fallback, not another table's)."""
    tactics = {(e["n"], e["k"], e["batch"]): stored_tactic(e["tactic"]) for e in table["entries"]}
    times = defaultdict(list)
    for path in (back_to_back, isolated):
        for cell in read_document(path)["cells"]:
            key = cell["n"], cell["k"], cell["batch"]
            ran = stored_tactic(cell["tactic"])
            if cell["policy"] == policy and cell["source"] == "table" and tactics.get(key) == ran:
                times[key].append(cell["us"])
    return {key: sum(us) / len(us) for key, us in times.items()}


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
    # Cells are matched by shape and batch: every entry must share one GPU, its dtypes and one mode.
    contexts = {(e["gpu"], e["sm_count"], e["weight_dtype"], e["output_dtype"], e["batch_invariant"])
                for table in tables for e in table["entries"]}
    if len(contexts) != 1:
        raise SystemExit("both tables must hold entries of one GPU, dtype pair and mode (batch-invariant or not), "
                         f"found {sorted(contexts, key=str) or 'none'}")
    invariant = contexts.pop()[-1]
    policy = "batch-invariant" if invariant else "tuned"
    scores = [bench_scores(getattr(args, f"bench_{run}"), getattr(args, f"isolated_{run}"), policy, table)
              for run, table in zip(("a", "b"), tables)]
    entries, counts = merge(tables, scores, invariant)
    write_table(args.out, entries, dsl_version=tables[1].get("cutlass_dsl"), measured=tables[1].get("measured"))
    load_table(args.out)  # the merged table must load: valid tactics, one summation order per invariant shape
    print(f"{len(entries)} entries: {counts[0]} from {args.table_a}, {counts[1]} from {args.table_b}")


if __name__ == "__main__":
    main()
