"""The benchmark: this projection next to torch.matmul and the measured read ceiling.

Every cell is timed the same way (``timing.py``: cold L2 by rotating weight
copies worth over 3x the L2, CUDA-graph replay, median of repeats) after every
provider's output has been checked against a float64 reference; torch.matmul and
the policies of one cell are replayed in turn, so drift does not favour one. The ceiling is
the read-only kernel of ``ceiling.py`` over the same weight bytes, so "fraction
of ceiling" is what this GPU actually reaches, not a datasheet figure.
"""

import contextlib
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from .ceiling import stream_read
from .checks import Reference
from .gpu import gpu_spec
from .policies import resolve_policies
from .projection import PreparedProjection
from .runtime import architecture
from .timing import cold_copies, foreign_kernel, graph_time_us, interleaved_time_us
from .warmup import compile_all

POLICY_KINDS = ("tuned", "heuristic", "batch-invariant")
# Launch kinds: with programmatic dependent launch (the default), or plain (PreparedProjection's
# programmatic_launch=False), whose cells are labelled "<policy>/plain".
LAUNCHES = {"programmatic": True, "plain": False}
CUBLAS = "torch.matmul"  # its entry among a cell's interleaved launches
# No read of HBM beats this (the H200 datasheet says 4.8 TB/s; the headroom is for the
# timing noise of the smallest weights, a few microseconds; tests/test_ceiling_gpu.py holds
# the largest to 5.0); a faster "ceiling" means the read-only kernel skipped bytes, and
# must not be reported.
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
                  programmatic_launches=(True,), clocks=None):
    """Time every cell of every policy kind and launch kind; returns the cells. Every kernel is compiled
    first, in parallel; ``clocks`` (a ClockLog) samples the GPU while the cells are timed, not while compiling."""
    device = torch.device("cuda", torch.cuda.current_device())
    compile_all(kernel_jobs(shapes, batches, kinds, device, architecture(device), weight_dtype, output_dtype,
                            programmatic_launches))
    cells = []
    total = len(shapes) * len(batches) * len(kinds) * len(programmatic_launches)
    with clocks or contextlib.nullcontext(), tqdm(total=total, desc="bench", unit="cell") as progress:
        for n, k in shapes:
            cells += bench_shape(n, k, batches, kinds, weight_dtype=weight_dtype, output_dtype=output_dtype,
                                 progress=progress, isolated=isolated, programmatic_launches=programmatic_launches)
    return cells
