"""After glue, does programmatic dependent launch cost time when the output's lines are cold in L2?

After a glue kernel our projection pays about 0.9 us for writing output lines
missing from L2 on 1536 x 128 at M=64, cuBLAS 0.2; under Nsight Compute, where
every kernel runs alone, our kernel itself pays only 0.06-0.2
(docs/performance.md, v20). So the cost lies between kernels. Ours is the only
one launched with programmatic dependent launch; this probe times the shipped
tactic with and without it, each into cold output copies and into one hot
output, back to back and after glue, next to torch.matmul. Needs a Hopper GPU.

    python scripts/probe_programmatic_launch.py 1536x128:16 1536x128:64 3072x128:64 7168x768:64
"""

import argparse

import torch

from decode_projection.checks import Reference
from decode_projection.projection import PreparedProjection
from decode_projection.timing import cold_copies, foreign_kernel, interleaved_time_us


def time_cell(n, k, batch):
    """{label: (back to back us, after glue us)}: torch.matmul and ours with and without programmatic launch,
    into cold output copies and into one hot output."""
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
    outs = [torch.empty(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    tactic = PreparedProjection.for_weight(weights[0], batches=(batch,)).policies[batch]
    reference = Reference(x, weights[0], torch.bfloat16)
    providers = {"torch.matmul": lambda i, out: torch.matmul(x, weights[i].T, out=out)}
    for name, programmatic in ((f"{tactic.label} PDL", True), (f"{tactic.label} no PDL", False)):
        projections = [PreparedProjection(w, {batch: tactic}, programmatic_launch=programmatic).prepare()
                       for w in weights]
        outs[0].fill_(float("nan"))
        reference.check(projections[0].run(x, outs[0]), label=f"{n}x{k} M={batch} {name}")
        providers[name] = lambda i, out, projections=projections: projections[i].run(x, out)
    launches = {}
    for name, run in providers.items():
        launches[f"{name} cold out"] = lambda i, run=run: run(i, outs[i])
        launches[f"{name} hot out"] = lambda i, run=run: run(i, outs[0])
    chained = interleaved_time_us(launches, copies)
    alone = interleaved_time_us(launches, copies, separator=foreign_kernel(x.device))
    return {label: (chained[label], alone[label]) for label in launches}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", help="NxK:M, timed with the shipped table's tactic")
    args = parser.parse_args()
    print(f"{'cell':<16} {'launch':<34} {'back to back us':>16} {'after glue us':>14}")
    for text in args.cells:
        shape, batch = text.split(":")
        n, k = (int(v) for v in shape.lower().split("x"))
        for label, (chained, alone) in time_cell(n, k, int(batch)).items():
            print(f"{f'{n}x{k} M={batch}':<16} {label:<34} {chained:16.2f} {alone:14.2f}")
        print(flush=True)


if __name__ == "__main__":
    main()
