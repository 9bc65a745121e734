"""The benchmark: this projection next to torch.matmul and the measured read ceiling.

Every cell is timed the same way (``timing.py``: cold L2 by rotating weight
copies worth over 3x the L2, CUDA-graph replay, median of repeats) after every
provider's output has been checked against a float64 reference; torch.matmul and
the policies of one cell are replayed in turn, so drift does not favour one. The ceiling is
the read-only kernel of ``ceiling.py`` over the same weight bytes, so "fraction
of ceiling" is what this GPU actually reaches, not a datasheet figure.
"""

import csv
import gzip
import json
import math
from dataclasses import asdict, dataclass, replace

import torch
from tqdm import tqdm

from .ceiling import stream_read
from .checks import Reference
from .gpu import gpu_spec
from .policies import resolve_policies
from .projection import PreparedProjection
from .runtime import architecture
from .tactic import as_tactic
from .timing import cold_copies, foreign_kernel, graph_time_us, interleaved_time_us
from .warmup import compile_all

POLICY_KINDS = ("tuned", "heuristic", "batch-invariant")
# Launch kinds: with programmatic dependent launch (the default), or plain (PreparedProjection's
# programmatic_launch=False), whose cells are labelled "<policy>/plain".
LAUNCHES = {"programmatic": True, "plain": False}
CUBLAS = "torch.matmul"  # its entry among a cell's interleaved launches
# No read of HBM beats this (the H200 datasheet says 4.8 TB/s); a faster "ceiling"
# means the read-only kernel skipped bytes, and must not be reported.
PLAUSIBLE_BYTES_PER_US = 5.5e6


@dataclass(frozen=True)
class Cell:
    """One timed (shape, batch) of one policy set, with the baselines of the same run."""

    n: int
    k: int
    batch: int
    policy: str
    source: str  # "table" or "heuristic"
    tactic: tuple
    us: float
    cublas_us: float
    ceiling_us: float | None  # None: not measured (or invalid) in that run
    output_bytes: int = 2  # per output element: 2 for BF16, 4 for FP32

    @property
    def moved_bytes(self) -> int:
        """Weight read once, activations read (16-bit operands), output written."""
        return 2 * (self.n * self.k + self.batch * self.k) + self.output_bytes * self.batch * self.n

    @property
    def tbps(self) -> float:
        """Achieved TB/s over the bytes that must move."""
        return self.moved_bytes / self.us / 1e6

    @property
    def of_ceiling(self) -> float | None:
        """Fraction of the measured read ceiling (ceiling time over ours)."""
        return None if self.ceiling_us is None else self.ceiling_us / self.us

    @property
    def speedup(self) -> float:
        """torch.matmul time over ours."""
        return self.cublas_us / self.us


def policies_for(kind, n, k, batches, device, weight_dtype, output_dtype):
    """``({batch: tactic}, {batch: source})`` for one policy kind (device None: the H200's)."""
    return resolve_policies(
        n, k, batches, gpu=gpu_spec(device), weight_dtype=weight_dtype, output_dtype=output_dtype,
        batch_invariant=kind == "batch-invariant", use_tables=kind != "heuristic",
    )


def policy_label(kind, programmatic_launch):
    """The name a cell's policy goes by: the kind, with "/plain" for launches without PDL."""
    return kind if programmatic_launch else f"{kind}/plain"


def kernel_jobs(shapes, batches, kinds, device, arch, weight_dtype, output_dtype, programmatic_launches=(True,)):
    """Every (tactic, output dtype, arch, weight dtype, programmatic launch) the policies of ``kinds`` need."""
    return {
        (tactic, output_dtype, arch, weight_dtype, programmatic)
        for n, k in shapes for kind in kinds
        for tactic in policies_for(kind, n, k, batches, device, weight_dtype, output_dtype)[0].values()
        for programmatic in programmatic_launches
    }


def bench_shape(n, k, batches, kinds, *, weight_dtype, output_dtype, progress, isolated=False,
                programmatic_launches=(True,)):
    """All cells of one weight shape; ``isolated`` puts a small foreign kernel before every launch."""
    device = torch.device("cuda", torch.cuda.current_device())
    separator = foreign_kernel(device) if isolated else None
    copies = cold_copies(n * k * 2, device)
    weights = [torch.randn(n, k, device=device).to(weight_dtype) for _ in range(copies)]
    ceiling = graph_time_us(lambda i: stream_read(weights[i]), copies, separator=separator)
    if n * k * 2 / ceiling > PLAUSIBLE_BYTES_PER_US:
        raise AssertionError(f"read ceiling {n * k * 2 / ceiling / 1e6:.1f} TB/s for {n}x{k} is not physical")
    prepared = {}
    for kind in kinds:
        policies, sources = policies_for(kind, n, k, batches, device, weight_dtype, output_dtype)
        for programmatic in programmatic_launches:
            projections = [PreparedProjection(w, policies, output_dtype=output_dtype,
                                              programmatic_launch=programmatic).prepare() for w in weights]
            prepared[policy_label(kind, programmatic)] = (projections, sources)
    cells = []
    for batch in batches:
        x = torch.randn(batch, k, device=device).to(weight_dtype)
        outs = [torch.full((batch, n), float("nan"), device=device, dtype=output_dtype) for _ in range(copies)]
        reference = Reference(x, weights[0], output_dtype)
        if not reference.torch_error < 1e-2:
            raise AssertionError(f"torch.matmul is off for {n}x{k} M={batch}: {reference.torch_error:.3g}")
        for label, (projections, _) in prepared.items():
            outs[0].fill_(float("nan"))
            projections[0].run(x, outs[0])
            reference.check(outs[0], label=f"{label} {n}x{k} M={batch}")
        # torch.matmul and every policy in one interleaved measurement: drift falls on all alike.
        launches = {CUBLAS: lambda i: torch.matmul(x, weights[i].T, out=outs[i])}
        launches.update({label: runner(projections, x, outs) for label, (projections, _) in prepared.items()})
        times = interleaved_time_us(launches, copies, separator=separator)
        for label, (projections, sources) in prepared.items():
            tactic = projections[0].policies[batch]
            cells.append(Cell(n, k, batch, label, sources[batch], tuple(asdict(tactic).values()), times[label],
                              times[CUBLAS], ceiling, outs[0].element_size()))
            progress.update()
    return cells


def runner(projections, x, outs):
    """``launch(i)``: the projection of weight copy ``i`` into output copy ``i``."""
    return lambda i: projections[i].run(x, outs[i])


def run_benchmark(shapes, batches, kinds, *, weight_dtype, output_dtype, isolated=False,
                  programmatic_launches=(True,)):
    """Time every cell of every policy kind and launch kind; returns the cells. Every kernel is compiled
    first, in parallel."""
    device = torch.device("cuda", torch.cuda.current_device())
    compile_all(kernel_jobs(shapes, batches, kinds, device, architecture(device), weight_dtype, output_dtype,
                            programmatic_launches))
    cells = []
    total = len(shapes) * len(batches) * len(kinds) * len(programmatic_launches)
    with tqdm(total=total, desc="bench", unit="cell") as progress:
        for n, k in shapes:
            cells += bench_shape(n, k, batches, kinds, weight_dtype=weight_dtype, output_dtype=output_dtype,
                                 progress=progress, isolated=isolated, programmatic_launches=programmatic_launches)
    return cells


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
            lines.append(f"{c.batch:>5} {c.policy + mark:>15} {as_tactic(c.tactic).label:>20} "
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


def cell_dicts(cells):
    """Flat dicts for CSV/JSON."""
    return [
        {**asdict(c), "tactic": list(c.tactic), "tbps": round(c.tbps, 3),
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
    fields = set(Cell.__dataclass_fields__)
    cells = [Cell(**{key: value for key, value in row.items() if key in fields}) for row in document["cells"]]
    return [replace(c, tactic=tuple(c.tactic)) for c in cells], document["meta"]


def write_csv(path, cells):
    """All cells as CSV."""
    data = cell_dicts(cells)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(data[0]))
        writer.writeheader()
        writer.writerows(data)


def write_json(path, cells, meta):
    """All cells and the run's metadata as JSON (gzipped where the path ends in ``.gz``)."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wt") as handle:
        json.dump({"meta": meta, "cells": cell_dicts(cells)}, handle, indent=1)


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
