"""Does the order in which two launches are timed bias their ratio? torch.matmul against the shipped projection.

Each cell is timed three ways after a fresh float64 reference check, as the
benchmark runs it: torch.matmul's graph first and then ours (the benchmark before
interleaving), ours first, and interleaved (``timing.interleaved_time_us``).
Prints torch.matmul's microseconds over ours for each. Needs a Hopper GPU.

    python scripts/timing_order.py
"""

import argparse

import torch

from decode_projection.checks import Reference
from decode_projection.projection import PreparedProjection
from decode_projection.timing import cold_copies, graph_time_us, interleaved_time_us

CELLS = [(1536, 128, 1), (2304, 1536, 1), (2304, 1536, 64), (7168, 1536, 16), (2112, 7168, 1), (7168, 14336, 16)]


def time_cell(n, k, batch):
    """{way: (torch.matmul us, ours us)} for one cell."""
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    projections = [PreparedProjection.for_weight(w, batches=(batch,)) for w in weights]
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]

    def cublas(i):
        torch.matmul(x, weights[i].T, out=outs[i])

    def ours(i):
        projections[i].run(x, outs[i])

    found = {}
    for way in ("torch.matmul first", "ours first", "interleaved"):
        outs[0].fill_(float("nan"))
        Reference(x, weights[0], torch.bfloat16).check(projections[0].run(x, outs[0]), label=f"{n}x{k} M={batch}")
        if way == "interleaved":
            times = interleaved_time_us({"cublas": cublas, "ours": ours}, copies)
            found[way] = (times["cublas"], times["ours"])
        elif way == "ours first":
            mine = graph_time_us(ours, copies)
            found[way] = (graph_time_us(cublas, copies), mine)
        else:
            theirs = graph_time_us(cublas, copies)
            found[way] = (theirs, graph_time_us(ours, copies))
    return found


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    ways = ("torch.matmul first", "ours first", "interleaved")
    print(f"{'cell':<20}" + "".join(f"{way + ' (cuBLAS/ours us)':>40}" for way in ways))
    for n, k, batch in CELLS:
        found = time_cell(n, k, batch)
        row = "".join(f"{f'{c:.2f} / {o:.2f} = {c / o:.3f}x':>40}" for c, o in (found[w] for w in ways))
        print(f"{f'{n}x{k} M={batch}':<20}{row}")


if __name__ == "__main__":
    main()
