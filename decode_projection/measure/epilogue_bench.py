"""The epilogue benchmark: each fused epilogue next to the projection followed by the PyTorch op it replaces.

Per shape, batch, epilogue and launch context (the benchmark's contexts, ``timing.CONTEXTS``) four providers, or
three: the projection alone (``plain``); the fused form (``fused``: ``PreparedProjection(bias=b)``, or
``run(x, out, residual=r)`` with ``r`` a tensor of its own, as a residual stream is); the projection followed by
the PyTorch op it replaces (``separate``: ``out += b`` or ``out += r``); for the residual, ``torch.addmm(r, x, W^T)``
(cuBLAS's epilogue). Timed as the benchmark times projections (cold weight copies, CUDA-graph replay, medians,
every provider interleaved in every context), after each has been checked against float64.
"""

from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from ..projection import PreparedProjection
from ..runtime import architecture
from ..warmup import policies_for
from .checks import Reference, relative_error
from .timing import LaunchContexts, cold_copies

EPILOGUES = ("residual", "bias")
# The Kimi-K3 projections whose outputs join the residual stream (DESIGN.md section 3): o_proj, the shared
# expert's down projection and the dense MLP's down projections (issue 42's shapes).
RESIDUAL_SHAPES = ((7168, 1536), (7168, 768), (7168, 3584), (7168, 4224))
PLAIN, FUSED, SEPARATE, ADDMM = "plain", "fused", "separate", "torch.addmm"


@dataclass(frozen=True)
class EpilogueCell:
    """One (shape, batch, epilogue, context): each provider's median microseconds (``addmm_us`` None for a bias)."""

    n: int
    k: int
    batch: int
    epilogue: str
    context: str
    plain_us: float
    fused_us: float
    separate_us: float
    addmm_us: float | None

    @property
    def fused_extra_us(self) -> float:
        """What fusing costs over the projection alone."""
        return self.fused_us - self.plain_us

    @property
    def speedup(self) -> float:
        """The projection and the separate op over the fused form."""
        return self.separate_us / self.fused_us


def epilogue_launches(epilogue, weights, x, outs, policies, output_dtype):
    """``({provider: launch(i)}, {provider: float64 addend of its reference or None})`` for one epilogue, batch and
    set of weight copies."""
    batch, n = x.shape[0], weights[0].shape[0]
    bias = epilogue == "bias"
    # A bias is one value per output column; a residual, a tensor of the output's shape.
    addend = torch.randn(n if bias else (batch, n), device=x.device).to(output_dtype)
    plain = [PreparedProjection(w, policies, output_dtype=output_dtype).prepare() for w in weights]
    fused = [PreparedProjection(w, policies, output_dtype=output_dtype, bias=addend if bias else None,
                                residual=not bias).prepare() for w in weights]
    reference_addend = addend.double()[None, :] if bias else addend.double()

    def fused_launch(i):
        fused[i].run(x, outs[i], residual=None if bias else addend)

    def separate(i):
        plain[i].run(x, outs[i])
        outs[i].add_(addend)

    launches = {PLAIN: lambda i: plain[i].run(x, outs[i]), FUSED: fused_launch, SEPARATE: separate}
    addends = {PLAIN: None, FUSED: reference_addend, SEPARATE: reference_addend}
    if not bias:
        launches[ADDMM] = lambda i: torch.addmm(addend, x, weights[i].T, out=outs[i])
        addends[ADDMM] = reference_addend
    return launches, addends


def bench_epilogues(shapes, batches, epilogues, *, contexts, weight_dtype=torch.bfloat16,
                    output_dtype=torch.bfloat16) -> list[EpilogueCell]:
    """Every cell of every epilogue in every launch context (module docstring); the shipped tables' tactics."""
    device = torch.device("cuda", torch.cuda.current_device())
    architecture(device)
    cells = []
    with tqdm(total=len(shapes) * len(batches) * len(epilogues), desc="epilogues", unit="cell") as progress:
        for n, k in shapes:
            copies = cold_copies(n * k * 2, device)
            weights = [torch.randn(n, k, device=device).to(weight_dtype) for _ in range(copies)]
            policies, _ = policies_for("tuned", n, k, batches, device, weight_dtype, output_dtype)
            for batch in batches:
                x = torch.randn(batch, k, device=device).to(weight_dtype)
                outs = [torch.full((batch, n), float("nan"), device=device, dtype=output_dtype)
                        for _ in range(copies)]
                around = LaunchContexts(contexts, x)
                for epilogue in epilogues:
                    launches, addends = epilogue_launches(epilogue, weights, x, outs, policies, output_dtype)
                    for name, launch in launches.items():
                        reference = Reference(x, weights[0], output_dtype, addends[name])
                        if name in (PLAIN, FUSED):
                            around.check(launch, outs[0], reference, label=f"{name} {epilogue} {n}x{k} M={batch}")
                        else:  # PyTorch's own forms round twice: held to a sanity bound, not to the fused one's
                            launch(0)
                            error = relative_error(outs[0], reference.value)
                            if not error < 1e-2:
                                raise AssertionError(f"{name} {epilogue} {n}x{k} M={batch}: error {error:.3g}")
                    times = around.time_us(launches, copies)
                    for context in contexts:
                        cells.append(EpilogueCell(n, k, batch, epilogue, context, times[context, PLAIN],
                                                  times[context, FUSED], times[context, SEPARATE],
                                                  times.get((context, ADDMM))))
                    progress.update()
    return cells


def epilogue_table(cells) -> str:
    """The cells as text: one block per shape and epilogue, a row per batch and context."""
    lines = []
    for n, k, epilogue in dict.fromkeys((c.n, c.k, c.epilogue) for c in cells):
        lines += ["", f"{n} x {k}, {epilogue} (us)",
                  f"{'batch':>5} {'context':>9} {'plain':>7} {'fused':>7} {'+us':>6} {'separate':>9} "
                  f"{'addmm':>7} {'separate/fused':>15}"]
        for c in (c for c in cells if (c.n, c.k, c.epilogue) == (n, k, epilogue)):
            addmm = "-" if c.addmm_us is None else f"{c.addmm_us:.2f}"
            lines.append(f"{c.batch:>5} {c.context:>9} {c.plain_us:>7.2f} {c.fused_us:>7.2f} {c.fused_extra_us:>6.2f} "
                         f"{c.separate_us:>9.2f} {addmm:>7} {c.speedup:>14.2f}x")
    return "\n".join(lines)


def epilogue_records(cells) -> list[dict]:
    """The cells as JSON-ready dicts."""
    return [asdict(cell) for cell in cells]
