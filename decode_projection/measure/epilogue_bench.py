"""The epilogue benchmark: each fused epilogue next to the projection followed by the op it replaces.

Per shape, batch, epilogue and launch context (the benchmark's contexts, ``timing.CONTEXTS``) these providers:

- ``plain``: the projection alone (for SiLU-and-mul, of the gate and up weights stacked, [2N, K]);
- ``fused``: the projection with the epilogue: ``PreparedProjection(bias=b)``; ``run(x, out, residual=r)`` with
  ``r`` a tensor of its own, as a residual stream is; ``PreparedProjection.gated(gate, up)``;
- ``separate``: the projection, then the op: ``out += b``, ``out += r``, or this package's PDL-aware
  ``silu_and_mul`` over the stacked projection's output;
- ``torch``: PyTorch's own one-call form where there is one: ``torch.addmm(r, x, W^T)`` (cuBLAS's epilogue) for
  the residual, the stacked projection then ``F.silu(g) * u`` for SiLU-and-mul.

Timed as the benchmark times projections (cold weight copies, CUDA-graph replay, medians, every provider
interleaved in every context), after the projection and the fused form have been checked against float64 and
the separate forms, which round twice, against a sanity bound.
"""

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..kernel.activation import silu_and_mul
from ..projection import PreparedProjection
from ..runtime import architecture
from ..warmup import policies_for
from .checks import GatedReference, Reference, relative_error
from .timing import LaunchContexts, cold_copies

EPILOGUES = ("residual", "bias", "silu-mul")
# The Kimi-K3 projections whose outputs join the residual stream (DESIGN.md section 3): o_proj, the shared
# expert's down projection and the dense MLP's down projections (issue 42's shapes).
RESIDUAL_SHAPES = ((7168, 1536), (7168, 768), (7168, 3584), (7168, 4224))
# And the gate and up halves (N x K each) of the shared expert and the dense MLP.
GATED_SHAPES = ((1536, 7168), (4224, 7168))
DEFAULT_SHAPES = {"residual": RESIDUAL_SHAPES, "bias": RESIDUAL_SHAPES, "silu-mul": GATED_SHAPES}
PLAIN, FUSED, SEPARATE, TORCH = "plain", "fused", "separate", "torch"
SANITY_BOUND = 1e-2  # relative error of the forms that round twice


@dataclass(frozen=True)
class EpilogueCell:
    """One (shape, batch, epilogue, context): each provider's median microseconds (``torch_us`` None for a bias)."""

    n: int
    k: int
    batch: int
    epilogue: str
    context: str
    plain_us: float
    fused_us: float
    separate_us: float
    torch_us: float | None

    @property
    def fused_extra_us(self) -> float:
        """What fusing costs over the projection alone."""
        return self.fused_us - self.plain_us

    @property
    def speedup(self) -> float:
        """The projection and the separate op over the fused form."""
        return self.separate_us / self.fused_us


@dataclass
class Providers:
    """One epilogue's launches of weight copy ``i`` (``launch(i)``), the output each writes for copy 0, and the
    reference each is judged by (a float64 Reference, or None for the sanity bound)."""

    launches: dict
    outputs: dict
    references: dict


@dataclass
class Prepared:
    """One shape's projections for one epilogue, a pair per weight copy: without the epilogue (for SiLU-and-mul,
    the stacked projection) and with it; ``bias`` is the bias the fused ones add (or None)."""

    plain: list
    fused: list
    bias: torch.Tensor | None = None


def prepare(epilogue, weights, policies, output_dtype) -> Prepared:
    """Every weight copy's projections for ``epilogue`` (for SiLU-and-mul ``weights`` are [2N, K], gate rows then
    up rows)."""
    plain = [PreparedProjection(w, policies, output_dtype=output_dtype).prepare() for w in weights]
    if epilogue == "silu-mul":
        n = weights[0].shape[0] // 2
        return Prepared(plain, [PreparedProjection.gated(w[:n], w[n:], tuple(policies), output_dtype=output_dtype)
                                for w in weights])
    bias = torch.randn(weights[0].shape[0], device=weights[0].device).to(output_dtype) if epilogue == "bias" else None
    return Prepared(plain, [PreparedProjection(w, policies, output_dtype=output_dtype, bias=bias,
                                               residual=bias is None).prepare() for w in weights], bias)


def addend_providers(prepared, weights, x, output_dtype) -> Providers:
    """The residual or bias providers (module docstring) over ``weights`` [N, K] copies."""
    batch, (n, _) = x.shape[0], weights[0].shape
    bias = prepared.bias
    # A bias is one value per output column; a residual, a tensor of the output's shape.
    addend = bias if bias is not None else torch.randn(batch, n, device=x.device).to(output_dtype)
    residual = None if bias is not None else addend
    outs = [torch.full((batch, n), float("nan"), device=x.device, dtype=output_dtype) for _ in weights]

    def separate(i):
        prepared.plain[i].run(x, outs[i])
        outs[i].add_(addend)

    launches = {PLAIN: lambda i: prepared.plain[i].run(x, outs[i]),
                FUSED: lambda i: prepared.fused[i].run(x, outs[i], residual=residual), SEPARATE: separate}
    if residual is not None:
        launches[TORCH] = lambda i: torch.addmm(residual, x, weights[i].T, out=outs[i])
    summed = Reference(x, weights[0], output_dtype, addend.double()[None, :] if bias is not None else addend.double())
    references = {PLAIN: Reference(x, weights[0], output_dtype), FUSED: summed, SEPARATE: None, TORCH: None}
    return Providers(launches, dict.fromkeys(launches, outs[0]), references)


def gated_providers(prepared, stacked, x, output_dtype) -> Providers:
    """The SiLU-and-mul providers (module docstring) over ``stacked`` [2N, K] copies, gate rows then up rows."""
    batch, n = x.shape[0], stacked[0].shape[0] // 2
    both = [torch.full((batch, 2 * n), float("nan"), device=x.device, dtype=output_dtype) for _ in stacked]
    outs = [torch.full((batch, n), float("nan"), device=x.device, dtype=output_dtype) for _ in stacked]

    def separate(i):
        prepared.plain[i].run(x, both[i])
        silu_and_mul(both[i], out=outs[i])

    def in_torch(i):
        prepared.plain[i].run(x, both[i])
        torch.mul(F.silu(both[i][:, :n]), both[i][:, n:], out=outs[i])

    launches = {PLAIN: lambda i: prepared.plain[i].run(x, both[i]), FUSED: lambda i: prepared.fused[i].run(x, outs[i]),
                SEPARATE: separate, TORCH: in_torch}
    outputs = {PLAIN: both[0], FUSED: outs[0], SEPARATE: outs[0], TORCH: outs[0]}
    references = {PLAIN: Reference(x, stacked[0], output_dtype),
                  FUSED: GatedReference(x, stacked[0][:n], stacked[0][n:], output_dtype), SEPARATE: None, TORCH: None}
    return Providers(launches, outputs, references)


def check_providers(providers, around, label):
    """The projection and the fused form against float64 in every context; the separate forms once, against
    SANITY_BOUND of the fused form's reference."""
    exact = providers.references[FUSED]
    for name, launch in providers.launches.items():
        out, reference = providers.outputs[name], providers.references[name]
        if reference is not None:
            around.check(launch, out, reference, label=f"{name} {label}")
            continue
        out.fill_(float("nan"))
        launch(0)
        error = relative_error(out, exact.value)
        if not error < SANITY_BOUND:
            raise AssertionError(f"{name} {label}: relative error {error:.3g}")


def bench_epilogues(shapes, batches, epilogues, *, contexts, weight_dtype=torch.bfloat16,
                    output_dtype=torch.bfloat16) -> list[EpilogueCell]:
    """Every cell of every epilogue in every launch context (module docstring), with the tables' tactics of the
    weight each provider streams. For SiLU-and-mul a shape is one half: N x K of the gate (and of the up)."""
    device = torch.device("cuda", torch.cuda.current_device())
    architecture(device)
    cells = []
    with tqdm(total=len(shapes) * len(batches) * len(epilogues), desc="epilogues", unit="cell") as progress:
        for n, k in shapes:
            for epilogue in epilogues:
                rows = 2 * n if epilogue == "silu-mul" else n
                copies = cold_copies(rows * k * 2, device)
                weights = [torch.randn(rows, k, device=device).to(weight_dtype) / k**0.25 for _ in range(copies)]
                policies, _ = policies_for("tuned", rows, k, batches, device, weight_dtype, output_dtype)
                prepared = prepare(epilogue, weights, policies, output_dtype)
                for batch in batches:
                    x = torch.randn(batch, k, device=device).to(weight_dtype)
                    if epilogue == "silu-mul":
                        providers = gated_providers(prepared, weights, x, output_dtype)
                    else:
                        providers = addend_providers(prepared, weights, x, output_dtype)
                    around = LaunchContexts(contexts, x)
                    check_providers(providers, around, f"{epilogue} {n}x{k} M={batch}")
                    times = around.time_us(providers.launches, copies)
                    for context in contexts:
                        cells.append(EpilogueCell(n, k, batch, epilogue, context, times[context, PLAIN],
                                                  times[context, FUSED], times[context, SEPARATE],
                                                  times.get((context, TORCH))))
                    progress.update()
    return cells


def epilogue_table(cells) -> str:
    """The cells as text: one block per shape and epilogue, a row per batch and context."""
    lines = []
    for n, k, epilogue in dict.fromkeys((c.n, c.k, c.epilogue) for c in cells):
        lines += ["", f"{n} x {k}, {epilogue} (us)",
                  f"{'batch':>5} {'context':>9} {'plain':>7} {'fused':>7} {'+us':>6} {'separate':>9} "
                  f"{'torch':>7} {'separate/fused':>15}"]
        for c in (c for c in cells if (c.n, c.k, c.epilogue) == (n, k, epilogue)):
            in_torch = "-" if c.torch_us is None else f"{c.torch_us:.2f}"
            lines.append(f"{c.batch:>5} {c.context:>9} {c.plain_us:>7.2f} {c.fused_us:>7.2f} {c.fused_extra_us:>6.2f} "
                         f"{c.separate_us:>9.2f} {in_torch:>7} {c.speedup:>14.2f}x")
    return "\n".join(lines)


def epilogue_records(cells) -> list[dict]:
    """The cells as JSON-ready dicts."""
    return [asdict(cell) for cell in cells]
