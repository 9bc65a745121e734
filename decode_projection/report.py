"""A benchmark run as people read it: text and Markdown tables, CSV and JSON files, and a plot.

Saved runs (``--json``) re-render without a GPU (``bench --from-json``), and
``scripts/speed_bars.py`` judges them against the speed issue's bars. A saved run
stores each cell's tactic by field name (format 2); runs saved before, with no
format and each tactic a list of its fields in order, still read.
"""

import csv
import gzip
import json
import math
from dataclasses import asdict, replace

from .bench import Cell
from .tactic import stored_tactic

FORMAT = 2  # of saved runs: tactics by field name
READABLE_FORMATS = (1, 2)  # 1: no "format" key, tactics as lists of their fields


def format_tables(cells) -> str:
    """A text table per shape and a summary line."""
    lines = []
    for n, k in dict.fromkeys((c.n, c.k) for c in cells):
        shape_cells = [c for c in cells if (c.n, c.k) == (n, k)]
        ceiling = shape_cells[0].ceiling_us
        measured = "no read ceiling" if ceiling is None else (
            f"read ceiling {ceiling:.2f} us = {n * k * 2 / ceiling / 1e6:.2f} TB/s")
        lines.append(f"\n{n} x {k} ({n * k * 2 / 1e6:.1f} MB; {measured})")
        lines.append(f"{'batch':>5} {'policy':>15} {'tactic':>20} {'us':>8} {'cuBLAS us':>9} "
                     f"{'TB/s':>6} {'of ceil':>7} {'speedup':>7}")
        for c in shape_cells:
            mark = "" if c.source == "table" else "*"
            of_ceiling = "-" if c.of_ceiling is None else f"{c.of_ceiling:.1%}"
            lines.append(f"{c.batch:>5} {c.policy + mark:>15} {stored_tactic(c.tactic).label:>20} "
                         f"{c.us:8.2f} {c.cublas_us:9.2f} {c.tbps:6.2f} {of_ceiling:>7} {c.speedup:6.2f}x")
    for kind in dict.fromkeys(c.policy for c in cells):
        ours = [c for c in cells if c.policy == kind]
        geomean = math.exp(sum(math.log(c.speedup) for c in ours) / len(ours))
        worst = min(ours, key=lambda c: c.speedup)
        lines.append(f"\n{kind}: geometric-mean speedup over torch.matmul {geomean:.2f}x over {len(ours)} cells; "
                     f"worst {worst.n}x{worst.k} M={worst.batch}: {worst.us:.2f} us vs {worst.cublas_us:.2f} us "
                     f"({worst.speedup:.2f}x)")
    lines.append("(* = heuristic tactic: no tuned table entry for this GPU, shape and batch)")
    return "\n".join(lines)


def format_markdown(cells, batches=(1, 16, 64, 256), policy="tuned") -> str:
    """A compact Markdown table: one row per shape, ours / cuBLAS microseconds at a few batches."""
    picked = [c for c in cells if c.policy == policy]
    header = "| N x K | MB | read ceiling us | " + " | ".join(f"M={b} ours / cuBLAS" for b in batches) + " |"
    lines = [header, "|---" * (3 + len(batches)) + "|"]
    for n, k in dict.fromkeys((c.n, c.k) for c in picked):
        by_batch = {c.batch: c for c in picked if (c.n, c.k) == (n, k)}
        ceiling = next(iter(by_batch.values())).ceiling_us
        times = [
            f"{by_batch[b].us:.1f} / {by_batch[b].cublas_us:.1f}" if b in by_batch else "-" for b in batches
        ]
        lines.append(f"| {n} x {k} | {n * k * 2 / 1e6:.1f} | {'-' if ceiling is None else f'{ceiling:.1f}'} | "
                     + " | ".join(times) + " |")
    geomeans = []
    for b in batches:
        speedups = [c.speedup for c in picked if c.batch == b]
        if speedups:
            geomeans.append(f"{math.exp(sum(map(math.log, speedups)) / len(speedups)):.2f}x at M={b}")
    if geomeans:
        lines.append("\nGeometric-mean speedup over torch.matmul: " + ", ".join(geomeans) + ".")
    return "\n".join(lines)


def cell_dicts(cells, *, tactic_as=lambda tactic: tactic.to_dict()):
    """Flat dicts for CSV/JSON, each cell's tactic as ``tactic_as`` gives it (by default its fields by name)."""
    return [
        {**asdict(c), "tactic": tactic_as(stored_tactic(c.tactic)), "tbps": round(c.tbps, 3),
         "of_ceiling": None if c.of_ceiling is None else round(c.of_ceiling, 4), "speedup": round(c.speedup, 3)}
        for c in cells
    ]


def read_document(path):
    """The JSON document of a run saved with ``write_json`` (gzipped where the path ends in ``.gz``)."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt") as handle:
        return json.load(handle)


def load_json(path):
    """``(cells, meta)`` of a run saved with ``write_json``, to re-render its tables and plot."""
    document = read_document(path)
    rows = document.get("cells") if isinstance(document, dict) else None
    if not rows or not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"{path}: not a saved benchmark run (it needs a non-empty list of cells)")
    found = document.get("format", 1)
    if type(found) is not int or found not in READABLE_FORMATS:
        raise ValueError(f"{path}: saved run format {found!r}, expected one of {READABLE_FORMATS}")
    fields = set(Cell.__dataclass_fields__)
    cells = [Cell(**{key: value for key, value in row.items() if key in fields}) for row in rows]
    return [replace(c, tactic=stored_tactic(c.tactic)) for c in cells], document["meta"]


def write_csv(path, cells):
    """All cells as CSV."""
    data = cell_dicts(cells, tactic_as=lambda tactic: tactic.label)  # one column, as the tables print it
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(data[0]))
        writer.writeheader()
        writer.writerows(data)


def write_json(path, cells, meta):
    """All cells and the run's metadata as JSON (gzipped where the path ends in ``.gz``)."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wt") as handle:
        json.dump({"format": FORMAT, "meta": meta, "cells": cell_dicts(cells)}, handle, indent=1)


def plot(path, cells, title):
    """Time against batch per shape: each policy, torch.matmul, and the read ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys((c.n, c.k) for c in cells))
    columns = min(4, len(shapes))
    grid_rows = math.ceil(len(shapes) / columns)
    figure, axes = plt.subplots(grid_rows, columns, figsize=(4 * columns, 3.2 * grid_rows), squeeze=False)
    for ax, (n, k) in zip(axes.flat, shapes):
        shape_cells = [c for c in cells if (c.n, c.k) == (n, k)]
        for kind in dict.fromkeys(c.policy for c in shape_cells):
            ours = [c for c in shape_cells if c.policy == kind]
            ax.plot([c.batch for c in ours], [c.us for c in ours], "o-", ms=3, label=f"decode_projection ({kind})")
        first = [c for c in shape_cells if c.policy == shape_cells[0].policy]
        ax.plot([c.batch for c in first], [c.cublas_us for c in first], "s--", ms=3, label="torch.matmul (cuBLAS)")
        if first[0].ceiling_us is not None:
            ax.axhline(first[0].ceiling_us, color="gray", ls=":", label="read ceiling (measured)")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{n} x {k}", fontsize=9)
        ax.set_xlabel("batch")
        ax.set_ylabel("us")
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
