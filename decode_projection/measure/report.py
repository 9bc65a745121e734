"""A benchmark run as people read it: text and Markdown tables, CSV and JSON files, and a plot.

Every table, summary line and plot panel is of one launch context (``timing.CONTEXTS``).
Saved runs (``--json``) re-render without a GPU (``bench --from-json``), and
``scripts/speed_bars.py`` judges them against the speed issue's bars. A saved run
stores each cell's tactic by field name (format 2); runs saved before, with no
format and each tactic a list of its fields in order, still read.
"""

import csv
import gzip
import json
import statistics
from collections import defaultdict
from dataclasses import asdict, replace

from ..kernel.tactic import stored_tactic
from .bench import Cell
from .timing import CHAIN, CONTEXTS, GLUE, geometric_mean

FORMAT = 2  # of saved runs: tactics by field name
READABLE_FORMATS = (1, 2)  # 1: no "format" key, tactics as lists of their fields


def format_tables(cells) -> str:
    """A text table per launch context and shape, then a summary line per context and policy."""
    lines = []
    contexts = list(dict.fromkeys(c.context for c in cells))
    for context in contexts:
        lines.append(f"\n== {context}: {CONTEXTS.get(context, 'unknown context')} ==")
        in_context = [c for c in cells if c.context == context]
        for n, k in dict.fromkeys((c.n, c.k) for c in in_context):
            shape_cells = [c for c in in_context if (c.n, c.k) == (n, k)]
            ceiling = shape_cells[0].ceiling_us
            measured = "no read ceiling" if ceiling is None else (
                f"read ceiling {ceiling:.2f} us = {n * k * 2 / ceiling / 1e6:.2f} TB/s")
            lines.append(f"\n{n} x {k} ({n * k * 2 / 1e6:.1f} MB; {measured}; {context})")
            lines.append(f"{'batch':>5} {'policy':>15} {'tactic':>20} {'us':>8} {'cuBLAS us':>9} "
                         f"{'TB/s':>6} {'of ceil':>7} {'speedup':>7}")
            for c in shape_cells:
                mark = "" if c.source == "table" else "*"
                of_ceiling = "-" if c.of_ceiling is None else f"{c.of_ceiling:.1%}"
                lines.append(f"{c.batch:>5} {c.policy + mark:>15} {stored_tactic(c.tactic).label:>20} "
                             f"{c.us:8.2f} {c.cublas_us:9.2f} {c.tbps:6.2f} {of_ceiling:>7} {c.speedup:6.2f}x")
    lines.append("")
    for context in contexts:
        for kind in dict.fromkeys(c.policy for c in cells if c.context == context):
            ours = [c for c in cells if c.policy == kind and c.context == context]
            worst = min(ours, key=lambda c: c.speedup)
            lines.append(f"{context} {kind}: geometric-mean speedup over torch.matmul "
                         f"{geometric_mean(c.speedup for c in ours):.2f}x over {len(ours)} cells; "
                         f"worst {worst.n}x{worst.k} M={worst.batch}: {worst.us:.2f} us vs {worst.cublas_us:.2f} us "
                         f"({worst.speedup:.2f}x)")
    lines.append("(* = heuristic tactic: no tuned table entry for this GPU, shape and batch)")
    return "\n".join(lines)


def format_markdown(cells, batches=(1, 16, 64, 256), policy="tuned", context=CHAIN) -> str:
    """A compact Markdown table of one policy in one context: a row per shape, ours / cuBLAS microseconds at a few
    batches."""
    picked = [c for c in cells if c.policy == policy and c.context == context]
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
            geomeans.append(f"{geometric_mean(speedups):.2f}x at M={b}")
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


def document_cells(document) -> list[dict]:
    """The cells of a saved run's JSON document, each with its launch context: a run saved before cells carried
    one was timed in a single context, which its method names (``bench --isolated``: after a foreign kernel)."""
    method = (document.get("meta") or {}).get("method", "")
    context = GLUE if "foreign kernel" in method else CHAIN
    return [{"context": context, **row} for row in document["cells"]]


def median_cells(runs) -> list[dict]:
    """One cell per (policy, context, shape, batch) of several runs' cells (each a ``document_cells`` list): the
    median of ours, of torch.matmul and of the read ceiling (None unless every run measured it)."""
    grouped = defaultdict(list)
    for cells in runs:
        for c in cells:
            grouped[c["policy"], c["context"], c["n"], c["k"], c["batch"]].append(c)
    return [
        dict(found[0], us=statistics.median(c["us"] for c in found),
             cublas_us=statistics.median(c["cublas_us"] for c in found),
             ceiling_us=None if any(c.get("ceiling_us") is None for c in found)
             else statistics.median(c["ceiling_us"] for c in found))
        for found in grouped.values()
    ]


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
    cells = [Cell(**{key: value for key, value in row.items() if key in fields}) for row in document_cells(document)]
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
    """Time against batch: a row of panels per shape, a column per launch context; in each, every policy,
    torch.matmul and the read ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys((c.n, c.k) for c in cells))
    contexts = list(dict.fromkeys(c.context for c in cells))
    figure, axes = plt.subplots(len(shapes), len(contexts), figsize=(4 * len(contexts), 2.8 * len(shapes)),
                                squeeze=False, sharey="row")
    for row, (n, k) in zip(axes, shapes):
        for ax, context in zip(row, contexts):
            panel = [c for c in cells if (c.n, c.k) == (n, k) and c.context == context]
            for kind in dict.fromkeys(c.policy for c in panel):
                ours = [c for c in panel if c.policy == kind]
                ax.plot([c.batch for c in ours], [c.us for c in ours], "o-", ms=3, label=f"decode_projection ({kind})")
            if panel:
                first = [c for c in panel if c.policy == panel[0].policy]
                ax.plot([c.batch for c in first], [c.cublas_us for c in first], "s--", ms=3,
                        label="torch.matmul (cuBLAS)")
                if first[0].ceiling_us is not None:
                    ax.axhline(first[0].ceiling_us, color="gray", ls=":", label="read ceiling (measured)")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{n} x {k}, {context}", fontsize=9)
            ax.set_xlabel("batch")
            ax.set_ylabel("us")
        row[0].set_ylim(bottom=0)  # once every panel of the row is drawn: they share the axis
    axes[0][0].legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
