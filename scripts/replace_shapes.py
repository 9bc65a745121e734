"""Replace whole shapes of a tuned table with those of a table tuned for only some shapes.

A batch-invariant table cannot be re-tuned cell by cell (``tune --update``): its summation order
must hold at every batch of a shape. Tune those shapes alone into a new table, then:

    python scripts/replace_shapes.py decode_projection/tables/h200-bf16-batch-invariant.json small-invariant.json
"""

import argparse
import json
from pathlib import Path

from decode_projection.tables import key_of, load_table, read_entries, write_table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the table to update in place")
    parser.add_argument("tuned", help="a table whose shapes replace the table's")
    args = parser.parse_args()
    entries, tuned = read_entries(args.table), read_entries(args.tuned)
    if len({e["batch_invariant"] for e in entries + tuned}) > 1:
        parser.error("one table is batch-invariant and the other is not")
    replaced = {key_of(e) for e in tuned}
    kept = [e for e in entries if key_of(e) not in replaced]
    stamp = json.loads(Path(args.tuned).read_text())
    merged = Path(args.table).with_suffix(".merged.json")
    write_table(merged, kept + tuned, dsl_version=stamp["cutlass_dsl"], measured=stamp["measured"])
    try:
        load_table(merged)  # every tactic valid, one summation order per batch-invariant shape
    except ValueError:
        merged.unlink()  # the table stays as it was
        raise
    merged.replace(args.table)
    print(f"{args.table}: {len(replaced)} shapes replaced ({len(tuned)} cells), {len(kept)} cells kept")


if __name__ == "__main__":
    main()
