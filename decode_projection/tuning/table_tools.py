"""Working with tuned tables: ``decode-projection tables replace | merge | diff``.

- ``replace TABLE TUNED``: the shapes TUNED holds replace TABLE's, whole. A batch-invariant table cannot be
  re-tuned cell by cell: its summation order must hold at every batch of a shape, so shapes are tuned alone
  into a new table and then replace the old ones.
- ``merge A A-BENCH... B B-BENCH... --out OUT``: per cell the tactic that measured faster in its table's own
  benchmark runs, scored as the tuner scores (the geometric mean over the launch contexts timed of its mean
  time in each); a batch-invariant table takes whole shapes, the run whose cells of a shape sum to less. The
  tuner can only pick among its candidates, and two runs draw different candidate lists. Re-run the benchmark
  on the merged table before quoting it: the minimum of two noisy runs flatters both.
- ``diff OLD NEW [OLD NEW ...] --timings T``: the cells a re-tune changed, largest gain first (the old tactic's
  score minus the new one's in the re-tune's own timings), as ``scripts/time_tactics.py`` cells.
"""

import json
from collections import defaultdict
from pathlib import Path

from ..kernel.tactic import stored_tactic
from ..measure.report import document_cells, read_document
from ..measure.timing import geometric_mean
from ..policy.tables import key_of, load_table, read_entries, write_table
from .tune import row_times


def replace_shapes(table_path, tuned_path) -> str:
    """Replace, in place, the shapes of the table at ``table_path`` that the one at ``tuned_path`` holds; a table
    that would not load (an invalid tactic, two orders in a batch-invariant shape) is never written."""
    entries, tuned = read_entries(table_path), read_entries(tuned_path)
    if len({e["batch_invariant"] for e in entries + tuned}) > 1:
        raise ValueError("one table is batch-invariant and the other is not")
    replaced = {key_of(e) for e in tuned}
    kept = [e for e in entries if key_of(e) not in replaced]
    stamp = json.loads(Path(tuned_path).read_text())
    merged = Path(table_path).with_suffix(".merged.json")
    write_table(merged, kept + tuned, dsl_version=stamp["cutlass_dsl"], measured=stamp["measured"])
    try:
        load_table(merged)
    except ValueError:
        merged.unlink()  # the table stays as it was
        raise
    merged.replace(table_path)
    return f"{table_path}: {len(replaced)} shapes replaced ({len(tuned)} cells), {len(kept)} cells kept"


def bench_scores(paths, policy, table) -> dict:
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


def runs_of(paths) -> list:
    """``[(table path, [benchmark paths])]``: each table file (a JSON document with entries) and the files after it."""
    runs = []
    for path in paths:
        document = read_document(path)
        if isinstance(document, dict) and "entries" in document:
            runs.append((path, []))
        elif not runs:
            raise ValueError(f"{path}: the first file must be a table, its benchmarks after it")
        else:
            runs[-1][1].append(path)
    if len(runs) != 2 or not all(benches for _, benches in runs):
        raise ValueError(f"two tables, each followed by its benchmark JSONs, expected; got {len(runs)} tables")
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


def merge_runs(files, out) -> str:
    """Merge the two tables among ``files`` (each followed by its benchmark JSONs) into ``out``."""
    runs = runs_of(files)
    tables = [read_document(path) for path, _ in runs]
    # Cells are matched by shape and batch: every entry must share one GPU, its dtypes and one mode.
    kinds = {(e["gpu"], e["sm_count"], e["weight_dtype"], e["output_dtype"], e["batch_invariant"])
             for table in tables for e in table["entries"]}
    if len(kinds) != 1:
        raise ValueError("both tables must hold entries of one GPU, dtype pair and mode (batch-invariant or not), "
                         f"found {sorted(kinds, key=str) or 'none'}")
    invariant = kinds.pop()[-1]
    policy = "batch-invariant" if invariant else "tuned"
    scores = [bench_scores(benches, policy, table) for (_, benches), table in zip(runs, tables)]
    entries, counts = merge(tables, scores, invariant)
    write_table(out, entries, dsl_version=tables[1].get("cutlass_dsl"), measured=tables[1].get("measured"))
    load_table(out)  # the merged table must load: valid tactics, one summation order per invariant shape
    return f"{len(entries)} entries: {counts[0]} from {runs[0][0]}, {counts[1]} from {runs[1][0]}"


def changed(pairs, timings) -> list[tuple[float, tuple, list]]:
    """``[(gain us, (n, k, batch), [old, new])]`` for every cell of each (old, new) table pair whose tactic differs,
    largest gain first: the old tactic's score minus the new one's in the re-tune's timings (0 where either is
    missing there)."""
    measured = {(row["n"], row["k"], row["batch"]): {stored_tactic(t): geometric_mean(us.values())
                                                     for t, us in row_times(row)}
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


def diff(tables, timings_path, most) -> str:
    """The changed cells of each (old, new) pair in ``tables``, one a line, then the ``most`` largest as one probe
    argument list."""
    if len(tables) % 2:
        raise ValueError("tables come in pairs: old, new")
    entries = [read_entries(path) for path in tables]
    found = changed(list(zip(entries[::2], entries[1::2])), json.loads(Path(timings_path).read_text()))
    lines = [f"{probe_cell(cell, tactics):<70} {gain:5.2f} us" for gain, cell, tactics in found]
    lines.append(" ".join(probe_cell(cell, tactics) for _, cell, tactics in found[:most]))
    return "\n".join(lines)
