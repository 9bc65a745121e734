"""Replace whole shapes of a tuned table with those of a table tuned for only some shapes.

A batch-invariant table cannot be re-tuned cell by cell (``tune --update``): its summation order
must hold at every batch of a shape. Tune those shapes alone into a new table, then:

    python scripts/replace_shapes.py decode_projection/tables/h200-bf16-batch-invariant.json small-invariant.json
"""

import argparse
import json
from pathlib import Path

from decode_projection.tables import read_entries, write_table


def shape_of(entry: dict) -> tuple:
    """What one tuning of a weight covers: its shape and dtypes."""
    return entry["n"], entry["k"], entry["weight_dtype"], entry["output_dtype"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the table to update in place")
    parser.add_argument("tuned", help="a table whose shapes replace the table's")
    args = parser.parse_args()
    tuned = read_entries(args.tuned)
    shapes = {shape_of(e) for e in tuned}
    kept = [e for e in read_entries(args.table) if shape_of(e) not in shapes]
    stamp = json.loads(Path(args.tuned).read_text())
    write_table(args.table, kept + tuned, dsl_version=stamp["cutlass_dsl"], measured=stamp["measured"])
    print(f"{args.table}: {len(shapes)} shapes replaced ({len(tuned)} cells), {len(kept)} cells kept")


if __name__ == "__main__":
    main()
