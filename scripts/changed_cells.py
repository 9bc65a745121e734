"""The cells a re-tune changed, as scripts/time_tactics.py cells: the old and the new tactic of each, largest gain first.

Compares each pair of tables cell by cell (free and batch-invariant alike) and ranks the changed cells by what the
re-tune's own timings (``tune --timings``) gave the old tactic over the new one in the same run (the tuner's score:
the geometric mean over the launch contexts timed), so that a probe after the re-tune times the cells that moved most
next to torch.matmul:

    python scripts/changed_cells.py --most 8 --timings tune-timings.json old-free.json new-free.json \\
        old-invariant.json new-invariant.json
"""

import argparse
import json
from pathlib import Path

from decode_projection.tables import key_of, read_entries
from decode_projection.tactic import stored_tactic
from decode_projection.timing import geometric_mean
from decode_projection.tune import row_times


def changed(pairs, timings) -> list[tuple[float, tuple, list]]:
    """``[(gain us, (n, k, batch), [old, new])]`` for every cell of each (old, new) table pair whose tactic differs,
    largest gain first: the old tactic's score minus the new one's in the re-tune's timings (0 where either is
    missing there)."""
    measured = {(row["n"], row["k"], row["batch"]): {stored_tactic(t): geometric_mean(us.values()) for t, us in row_times(row)}
                for row in timings}
    found = []
    for old_entries, new_entries in pairs:
        old = {(key_of(e), e["batch"]): stored_tactic(e["tactic"]) for e in old_entries}
        for entry in new_entries:
            before, after = old.get((key_of(entry), entry["batch"])), stored_tactic(entry["tactic"])
            if before is None or before == after:
                continue
            cell = (entry["n"], entry["k"], entry["batch"])
            means = measured.get(cell, {})
            gain = means[before] - means[after] if before in means and after in means else 0.0
            found.append((gain, cell, [before, after]))
    return sorted(found, key=lambda item: -item[0])


def probe_cell(cell, tactics) -> str:
    """``NxK:M:t1/t2`` in time_tactics.py's syntax (a tactic's label without its parentheses)."""
    n, k, batch = cell
    return f"{n}x{k}:{batch}:" + "/".join(t.label.strip("()") for t in tactics)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="old and new table, in pairs")
    parser.add_argument("--timings", required=True, help="the re-tune's --timings JSON")
    parser.add_argument("--most", type=int, default=8, help="cells to print (default: %(default)s)")
    args = parser.parse_args()
    if len(args.tables) % 2:
        parser.error("tables come in pairs: old, new")
    entries = [read_entries(path) for path in args.tables]
    found = changed(list(zip(entries[::2], entries[1::2])), json.loads(Path(args.timings).read_text()))
    for gain, cell, tactics in found:
        print(f"{probe_cell(cell, tactics):<70} {gain:5.2f} us")
    print(" ".join(probe_cell(cell, tactics) for _, cell, tactics in found[: args.most]))


if __name__ == "__main__":
    main()
