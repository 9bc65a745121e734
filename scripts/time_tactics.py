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
against this tree without the drift between processes. Needs a Hopper GPU.

    python scripts/time_tactics.py 6288x7168:64:128,64,1,9,1,4/64,64,1,13 7168x1536:48:64,64,1,7
    python scripts/time_tactics.py 7168x4224:1:56,8,1,6,4/56,8,1,6,4,E
    python scripts/time_tactics.py --one-output --no-programmatic-launch 1536x128:64:64,64,1,4
    python scripts/time_tactics.py --compare-package decode_projection_changed 2112x7168:64:64,64,3,7
"""

import argparse
import importlib
from dataclasses import astuple

import torch

from decode_projection.kernel.tactic import SplitKTactic, as_tactic
from decode_projection.measure.checks import Reference
from decode_projection.measure.timing import cold_copies, foreign_kernel, interleaved_time_us
from decode_projection.projection import PreparedProjection
from decode_projection.runtime import architecture
from decode_projection.warmup import compile_all


def parse_cell(text):
    """(n, k, batch, tactics) from ``NxK:M:t1/t2``."""
    shape, batch, tactics = text.split(":")
    n, k = (int(v) for v in shape.lower().split("x"))
    return n, k, int(batch), [parse_tactic(t) for t in tactics.split("/")]


def parse_tactic(text):
    """A tactic from its label without the parentheses (``SplitKTactic.from_label``), in either case."""
    try:
        return as_tactic(SplitKTactic.from_label(text.upper()))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def time_cell(n, k, batch, tactics, one_output=False, without_programmatic_launch=False, compared=None):
    """{label: (back to back us, after glue us)} for torch.matmul and each tactic; with ``one_output``
    each of them again writing ``outs[0]`` only, with ``without_programmatic_launch`` each tactic
    again prepared with ``programmatic_launch=False``, with ``compared`` (a copy of the package) each
    tactic again as that copy compiles it."""
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
    outs = [torch.empty(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    reference = Reference(x, weights[0], torch.bfloat16)
    runs = {"torch.matmul": lambda i, out: torch.matmul(x, weights[i].T, out=out)}  # weight copy i into out
    packages = [(PreparedProjection, as_tactic, "")]
    if compared is not None:
        packages.append((compared.PreparedProjection, compared.tactic.as_tactic, f" [{compared.__name__}]"))
    for programmatic in (True, False) if without_programmatic_launch else (True,):
        for (prepared, own_tactic, suffix), tactic in [(package, t) for t in tactics for package in packages]:
            label = tactic.label + ("" if programmatic else " no PDL") + suffix
            projections = [prepared(w, {batch: own_tactic(astuple(tactic))}, programmatic_launch=programmatic).prepare()
                           for w in weights]
            outs[0].fill_(float("nan"))
            reference.check(projections[0].run(x, outs[0]), label=f"{n}x{k} M={batch} {label}")
            runs[label] = lambda i, out, projections=projections: projections[i].run(x, out)
    launches = {label: lambda i, run=run: run(i, outs[i]) for label, run in runs.items()}
    if one_output:
        launches.update({f"{label} one out": lambda i, run=run: run(i, outs[0]) for label, run in runs.items()})
    chained = interleaved_time_us(launches, copies)
    alone = interleaved_time_us(launches, copies, separators=dict.fromkeys(launches, foreign_kernel(x.device)))
    return {label: (chained[label], alone[label]) for label in launches}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", type=parse_cell, help="NxK:M:tactic/tactic/...")
    parser.add_argument("--one-output", action="store_true", help="also time every launch writing one output buffer")
    parser.add_argument("--compare-package", metavar="NAME",
                        help="also time every tactic from a changed copy of the package importable as NAME")
    parser.add_argument("--no-programmatic-launch", action="store_true",
                        help="also time every tactic launched without programmatic dependent launch")
    args = parser.parse_args()
    arch = architecture(torch.device("cuda"))
    launch_kinds = (True, False) if args.no_programmatic_launch else (True,)
    # The copy's modules by their flat names (compared.tactic, compared.warmup): they hold in a copy from before the
    # folders and, through decode_projection.MOVED, in one after them.
    compared = importlib.import_module(args.compare_package) if args.compare_package else None
    compile_all((t, torch.bfloat16, arch, torch.bfloat16, programmatic)
                for *_, tactics in args.cells for t in tactics for programmatic in launch_kinds)
    if compared is not None:
        importlib.import_module(f"{compared.__name__}.warmup").compile_all(
            (compared.tactic.as_tactic(astuple(t)), torch.bfloat16, arch, torch.bfloat16, programmatic)
            for *_, tactics in args.cells for t in tactics for programmatic in launch_kinds)
    print(f"{'cell':<18} {'launch':<50} {'back to back us':>16} {'after glue us':>14} {'mean':>7}")
    for n, k, batch, tactics in args.cells:
        timed = time_cell(n, k, batch, tactics, args.one_output, args.no_programmatic_launch, compared)
        for label, (chained, alone) in timed.items():
            print(f"{f'{n}x{k} M={batch}':<18} {label:<50} {chained:16.2f} {alone:14.2f} {(chained + alone) / 2:7.2f}")
        print(flush=True)


if __name__ == "__main__":
    main()
