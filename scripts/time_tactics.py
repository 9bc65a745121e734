"""Time chosen tactics of one cell next to torch.matmul: a probe for hypotheses the tuner's candidates miss.

Each cell is ``NxK:M:tactic/tactic/...``, a tactic its label without the
parentheses: its numbers separated by commas (those after the stages may be left
out where they are 1), then ``B`` to put the weight on wgmma's B side, ``E`` to
let the next launch in as the tactic starts, ``F2`` or ``F4`` to fold K.
Every tactic is checked against float64 on fresh random inputs with a
NaN-poisoned output, then all of them and torch.matmul are timed interleaved
(``timing.interleaved_time_us``), back to back and after a glue kernel. Like the
benchmark, each launch writes its own output copy, so the output's lines are
cold in L2; ``--one-output`` also times every launch writing one output buffer
(hot in L2), which tells the cost of writing cold lines from the rest, and
``--no-programmatic-launch`` every tactic launched without programmatic
dependent launch. ``--compare-package NAME`` also times every tactic as a
changed copy of the package compiles it, the copy importable as ``NAME``
(its folder renamed), interleaved in the same process: a kernel change
against this tree without the drift between processes. ``--gated`` makes each
cell a gate/up pair of N gate rows each, the kernel's weight their 2N x K
interleave (``interleave_gate_up``): every tactic runs as a gated projection
checked against float64 ``silu(x @ gate^T) * (x @ up^T)``, timed next to the
plain projection of the 2N x K weight (its table's or the heuristic's tactic)
and torch.matmul on it; the word ``candidates`` in place of the tactics times
the first GATED_CANDIDATES of ``policies.gated_candidates`` for this GPU.
``--residual`` runs every tactic adding a residual of the output's shape (a tensor
of its own, as the epilogue benchmark's), checked against float64, timed next to
the plain projection of its table's or the heuristic's tactic with and without it.
Needs a Hopper GPU.

    python scripts/time_tactics.py 6288x7168:64:128,64,1,9,1,4/64,64,1,13 7168x1536:48:64,64,1,7
    python scripts/time_tactics.py 7168x4224:1:56,8,1,6,4/56,8,1,6,4,E
    python scripts/time_tactics.py --one-output --no-programmatic-launch 1536x128:64:64,64,1,4
    python scripts/time_tactics.py --compare-package decode_projection_changed 2112x7168:64:64,64,3,7
    python scripts/time_tactics.py --gated 1536x7168:1:candidates 1536x7168:64:candidates
    python scripts/time_tactics.py --residual 7168x768:64:128,64,1,9,1/64,64,1,3,4
"""

import argparse
import importlib
from dataclasses import astuple

import torch

from decode_projection.kernel.tactic import SplitKTactic, as_tactic
from decode_projection.measure.checks import GatedReference, Reference
from decode_projection.measure.timing import cold_copies, foreign_kernel, interleaved_time_us
from decode_projection.policy.policies import gated_candidates
from decode_projection.projection import Epilogue, PreparedProjection, interleave_gate_up, interleaved_rows
from decode_projection.runtime import architecture
from decode_projection.runtime.gpu import gpu_spec
from decode_projection.warmup import compile_all

CANDIDATES = "candidates"  # in place of a gated cell's tactics: the first GATED_CANDIDATES of gated_candidates
# The best predicted of them, each compiled, checked and timed (3072 x 7168's folded tiles rank 13th on, H100; its
# 48-row tiles split in two, 35th on, though they ran fastest after glue: name them).
GATED_CANDIDATES = 16


def parse_cell(text):
    """(n, k, batch, tactics) from ``NxK:M:t1/t2``; tactics None from ``NxK:M:candidates``."""
    shape, batch, tactics = text.split(":")
    n, k = (int(v) for v in shape.lower().split("x"))
    if tactics.lower() == CANDIDATES:
        return n, k, int(batch), None
    return n, k, int(batch), [parse_tactic(t) for t in tactics.split("/")]


def parse_tactic(text):
    """A tactic from its label without the parentheses (``SplitKTactic.from_label``), in either case."""
    try:
        return as_tactic(SplitKTactic.from_label(text.upper()))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def with_candidates(cells, gpu):
    """``cells`` with the tactics of each gated ``candidates`` cell: the first GATED_CANDIDATES of gated_candidates
    for its gate/up pair's interleaved weight on ``gpu``."""
    return [(n, k, batch, tactics if tactics is not None
             else gated_candidates(interleaved_rows(n), k, batch, gpu)[:GATED_CANDIDATES])
            for n, k, batch, tactics in cells]


def compile_jobs(cells, arch, launch_kinds, own_tactic, epilogue=None):
    """compile_all's jobs: each tactic of ``cells`` (as ``own_tactic`` takes it) launched each way in
    ``launch_kinds``, with ``epilogue`` where one is given."""
    extra = () if epilogue is None else (epilogue,)
    return [(own_tactic(astuple(t)), torch.bfloat16, arch, torch.bfloat16, programmatic, *extra)
            for *_, tactics in cells for t in tactics for programmatic in launch_kinds]


def time_cell(n, k, batch, tactics, one_output=False, without_programmatic_launch=False, compared=None, gated=False,
              residual=False):
    """{label: (back to back us, after glue us)} for torch.matmul and each tactic; with ``one_output``
    each of them again writing ``outs[0]`` only, with ``without_programmatic_launch`` each tactic
    again prepared with ``programmatic_launch=False``, with ``compared`` (a copy of the package) each
    tactic again as that copy compiles it; with ``gated`` each tactic as a gated projection of a gate/up
    pair of ``n`` rows each, next to the plain projection of their interleaved weight (as ``for_weight``
    prepares it), torch.matmul multiplying by that weight; with ``residual`` each tactic adding a residual, next to
    the plain projection as ``for_weight`` prepares it, with and without the residual."""
    x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
    rows = interleaved_rows(n) if gated else n
    copies = cold_copies(rows * k * 2)
    if gated:
        # Scaled by K^-1/4 as the epilogue benchmark's, so the gate sums are of a few units, as a model's.
        pairs = [[(torch.randn(n, k, device="cuda") / k**0.25).to(torch.bfloat16) for _ in range(2)]
                 for _ in range(copies)]
        weights = [interleave_gate_up(*pair) for pair in pairs]
        reference = GatedReference(x, *pairs[0], torch.bfloat16)
    else:
        weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        plain_reference = Reference(x, weights[0], torch.bfloat16)
    addend = torch.randn(batch, n, device="cuda").to(torch.bfloat16) if residual else None
    if not gated:
        reference = Reference(x, weights[0], torch.bfloat16, addend) if residual else plain_reference
    outs = [torch.empty(batch, rows, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    tactic_outs = [torch.empty(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)] if gated else outs
    # label: (launch(i, out), the outputs it writes, one per weight copy)
    runs = {"torch.matmul": (lambda i, out: torch.matmul(x, weights[i].T, out=out), outs)}  # weight copy i into out
    packages = [(PreparedProjection, as_tactic, "")]
    if compared is not None:
        packages.append((compared.PreparedProjection, compared.tactic.as_tactic, f" [{compared.__name__}]"))
    gated_rows = {"gated_rows": n} if gated else {}
    with_residual = {"residual": True} if residual else {}
    run_args = {"residual": addend} if residual else {}
    for programmatic in (True, False) if without_programmatic_launch else (True,):
        if gated:
            plain = [PreparedProjection.for_weight(w, (batch,), programmatic_launch=programmatic) for w in weights]
            label = (f"plain {rows}x{k} {plain[0].policies[batch].label} {plain[0].policy_sources[batch]}"
                     + ("" if programmatic else " no PDL"))
            outs[0].fill_(float("nan"))
            Reference(x, weights[0], torch.bfloat16).check(plain[0].run(x, outs[0]), f"{rows}x{k} M={batch} {label}")
            runs[label] = (lambda i, out, plain=plain: plain[i].run(x, out), outs)
        if residual:
            plain = [PreparedProjection.for_weight(w, (batch,), programmatic_launch=programmatic) for w in weights]
            fused = [PreparedProjection.for_weight(w, (batch,), programmatic_launch=programmatic, residual=True)
                     for w in weights]
            label = f"plain {plain[0].policies[batch].label} {plain[0].policy_sources[batch]}" + (
                "" if programmatic else " no PDL")
            outs[0].fill_(float("nan"))
            plain_reference.check(plain[0].run(x, outs[0]), f"{n}x{k} M={batch} {label}")
            outs[0].fill_(float("nan"))
            reference.check(fused[0].run(x, outs[0], residual=addend), f"{n}x{k} M={batch} residual {label}")
            runs[label] = (lambda i, out, plain=plain: plain[i].run(x, out), outs)
            runs["residual " + label] = (lambda i, out, fused=fused: fused[i].run(x, out, residual=addend), outs)
        for (prepared, own_tactic, suffix), tactic in [(package, t) for t in tactics for package in packages]:
            kind = "gated " if gated else "residual " if residual else ""
            label = kind + tactic.label + ("" if programmatic else " no PDL") + suffix
            projections = [prepared(w, {batch: own_tactic(astuple(tactic))}, programmatic_launch=programmatic,
                                    **gated_rows, **with_residual).prepare()
                           for w in weights]
            tactic_outs[0].fill_(float("nan"))
            reference.check(projections[0].run(x, tactic_outs[0], **run_args), label=f"{n}x{k} M={batch} {label}")
            runs[label] = (lambda i, out, projections=projections: projections[i].run(x, out, **run_args),
                           tactic_outs)
    launches = {label: lambda i, run=run, into=into: run(i, into[i]) for label, (run, into) in runs.items()}
    if one_output:
        launches.update({f"{label} one out": lambda i, run=run, into=into: run(i, into[0])
                         for label, (run, into) in runs.items()})
    chained = interleaved_time_us(launches, copies)
    alone = interleaved_time_us(launches, copies, separators=dict.fromkeys(launches, foreign_kernel(x.device)))
    return {label: (chained[label], alone[label]) for label in launches}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", type=parse_cell, help="NxK:M:tactic/tactic/... (NxK:M:candidates "
                        "with --gated)")
    parser.add_argument("--one-output", action="store_true", help="also time every launch writing one output buffer")
    parser.add_argument("--compare-package", metavar="NAME",
                        help="also time every tactic from a changed copy of the package importable as NAME")
    parser.add_argument("--no-programmatic-launch", action="store_true",
                        help="also time every tactic launched without programmatic dependent launch")
    parser.add_argument("--gated", action="store_true",
                        help="each cell is a gate/up pair of N rows each: its tactics run as gated projections")
    parser.add_argument("--residual", action="store_true",
                        help="every tactic adds a residual, timed next to the plain projection with and without it")
    args = parser.parse_args()
    if args.gated and args.residual:
        parser.error("--gated takes no residual: a gated projection writes silu(gate) * up")
    if not args.gated and any(tactics is None for *_, tactics in args.cells):
        parser.error(f"'{CANDIDATES}' in place of the tactics takes --gated")
    arch = architecture(torch.device("cuda"))
    cells = with_candidates(args.cells, gpu_spec(torch.device("cuda")))
    launch_kinds = (True, False) if args.no_programmatic_launch else (True,)
    # The copy's modules by their flat names (compared.tactic, compared.warmup): they hold in a copy from before the
    # folders and, through decode_projection.MOVED, in one after them.
    compared = importlib.import_module(args.compare_package) if args.compare_package else None
    epilogue = Epilogue(gated=True) if args.gated else Epilogue(residual=True) if args.residual else None
    compile_all(compile_jobs(cells, arch, launch_kinds, as_tactic, epilogue))
    if compared is not None:
        # By the fields set here only: a copy from before a field was added takes the others.
        theirs = None if epilogue is None else importlib.import_module(f"{compared.__name__}.projection").Epilogue(
            **{name: value for name, value in epilogue._asdict().items() if value != Epilogue._field_defaults[name]})
        importlib.import_module(f"{compared.__name__}.warmup").compile_all(
            compile_jobs(cells, arch, launch_kinds, compared.tactic.as_tactic, theirs))
    print(f"{'cell':<18} {'launch':<50} {'back to back us':>16} {'after glue us':>14} {'mean':>7}")
    for n, k, batch, tactics in cells:
        timed = time_cell(n, k, batch, tactics, args.one_output, args.no_programmatic_launch, compared, args.gated,
                          args.residual)
        for label, (chained, alone) in timed.items():
            print(f"{f'{n}x{k} M={batch}':<18} {label:<50} {chained:16.2f} {alone:14.2f} {(chained + alone) / 2:7.2f}")
        print(flush=True)


if __name__ == "__main__":
    main()
