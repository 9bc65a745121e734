"""The benchmark: this projection next to torch.matmul and the measured read ceiling, in every launch context.

Every cell is timed the same way (``timing.py``: cold L2 by rotating weight
copies worth over 3x the L2, CUDA-graph replay, median of repeats) in each
launch context asked for (``timing.CONTEXTS``: back to back; after a PDL-aware
glue kernel that writes the activations; after a plain PyTorch kernel; a glue
kernel's own time, measured alone in the same rounds, is subtracted), after
every provider's output has been checked against a float64 reference in each of
them. torch.matmul and the policies of one cell are replayed in turn in every
context, so drift does not favour one. The ceiling is the read-only kernel of
``ceiling.py`` over the same weight bytes, in the same contexts, so "fraction of
ceiling" is what this GPU actually reaches, not a datasheet figure.
"""

import contextlib
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from ..projection import PreparedProjection
from ..runtime import architecture
from ..warmup import compile_all, kernel_jobs, policies_for
from .ceiling import stream_read
from .checks import Reference
from .timing import CHAIN, CONTEXTS, LaunchContexts, cold_copies

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
    context: str = CHAIN  # what every timed launch followed: a name of timing.CONTEXTS

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


def policy_label(kind, programmatic_launch):
    """The name a cell's policy goes by: the kind, with "/plain" for launches without PDL."""
    return kind if programmatic_launch else f"{kind}/plain"


def read_ceilings(weights, copies, contexts) -> dict:
    """``{context: microseconds}`` of the read-only kernel over each weight copy in turn, in every context."""
    n, k = weights[0].shape
    # The PDL-aware glue writes activations: one row of them here, which the read-only kernel never reads.
    row = torch.randn(1, k, device=weights[0].device).to(weights[0].dtype)
    times = LaunchContexts(contexts, row).time_us({"ceiling": lambda i: stream_read(weights[i])}, copies)
    ceilings = {context: times[context, "ceiling"] for context in contexts}
    for context, us in ceilings.items():
        if n * k * 2 / us > PLAUSIBLE_BYTES_PER_US:
            raise AssertionError(f"read ceiling {n * k * 2 / us / 1e6:.1f} TB/s for {n}x{k} in {context} "
                                 "is not physical")
    return ceilings


def bench_shape(n, k, batches, kinds, *, weight_dtype, output_dtype, progress, contexts=tuple(CONTEXTS),
                programmatic_launches=(True,)):
    """All cells of one weight shape, in every launch context of ``contexts``."""
    device = torch.device("cuda", torch.cuda.current_device())
    copies = cold_copies(n * k * 2, device)
    weights = [torch.randn(n, k, device=device).to(weight_dtype) for _ in range(copies)]
    ceilings = read_ceilings(weights, copies, contexts)
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
        around = LaunchContexts(contexts, x)
        outs = [torch.full((batch, n), float("nan"), device=device, dtype=output_dtype) for _ in range(copies)]
        reference = Reference(x, weights[0], output_dtype)
        if not reference.torch_error < 1e-2:
            raise AssertionError(f"torch.matmul is off for {n}x{k} M={batch}: {reference.torch_error:.3g}")
        launches = {CUBLAS: lambda i: torch.matmul(x, weights[i].T, out=outs[i])}
        launches.update({label: runner(projections, x, outs) for label, (projections, _) in prepared.items()})
        for label, launch in launches.items():
            around.check(launch, outs[0], reference, label=f"{label} {n}x{k} M={batch}")
        # torch.matmul and every policy in every context in one interleaved measurement: drift falls on all alike.
        times = around.time_us(launches, copies)
        for context in contexts:
            for label, (projections, sources) in prepared.items():
                tactic = projections[0].policies[batch]
                cells.append(Cell(n, k, batch, label, sources[batch], tactic,
                                  times[context, label], times[context, CUBLAS], ceilings[context],
                                  outs[0].element_size(), context))
                progress.update()
    return cells


def runner(projections, x, outs):
    """``launch(i)``: the projection of weight copy ``i`` into output copy ``i``."""
    return lambda i: projections[i].run(x, outs[i])


def run_benchmark(shapes, batches, kinds, *, weight_dtype, output_dtype, contexts=tuple(CONTEXTS),
                  programmatic_launches=(True,), clocks=None):
    """Time every cell of every policy kind and launch kind in every launch context; returns the cells. Every kernel
    is compiled first, in parallel; ``clocks`` (a ClockLog) samples the GPU while the cells are timed, not while
    compiling."""
    device = torch.device("cuda", torch.cuda.current_device())
    compile_all(kernel_jobs(shapes, batches, kinds, device, architecture(device), weight_dtype, output_dtype,
                            programmatic_launches))
    cells = []
    total = len(shapes) * len(batches) * len(kinds) * len(programmatic_launches) * len(contexts)
    with clocks or contextlib.nullcontext(), tqdm(total=total, desc="bench", unit="cell") as progress:
        for n, k in shapes:
            cells += bench_shape(n, k, batches, kinds, weight_dtype=weight_dtype, output_dtype=output_dtype,
                                 progress=progress, contexts=contexts, programmatic_launches=programmatic_launches)
    return cells
