"""Does the weight map's L2 promotion cost bandwidth? Time shipped tactics with 256 B, 128 B and none.

Under Nsight Compute (scripts/profile_cells.py) every cell read exactly the
weight's bytes from DRAM with each promotion, yet 256 B (shipped until then) was up to
6% slower than 128 B on 7168x14336 M=1. ncu times one launch with its caches
flushed; this script times the way `bench` does (cold L2, CUDA-graph replay,
back to back, median) and interleaves the three promotions over several rounds,
so a difference below the rounds' spread reads as noise.

    python scripts/l2_promotion.py [--rounds 3]
"""

import argparse
import statistics

import cuda.bindings.driver as cuda
import cutlass
import torch

from decode_projection.projection import PreparedProjection, weight_map
from decode_projection.timing import cold_copies, graph_time_us

CELLS = ((7168, 14336, 1), (8448, 7168, 1), (20480, 7168, 1), (6288, 7168, 16), (7168, 4224, 1),
         (3584, 7168, 1), (2112, 7168, 1), (7168, 1536, 1), (7168, 14336, 64), (20480, 7168, 64))
PROMOTIONS = {
    "256B": cuda.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    "128B": cuda.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    "none": cuda.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
}


def time_cell(n, k, batch, rounds):
    """{promotion: [us per round]} for the shipped tactic of one cell."""
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
    outs = [torch.empty(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    projections = [PreparedProjection.for_weight(w, batches=(batch,)) for w in weights]
    rows = projections[0].policies[batch].weight_load_rows
    # The kernel's weight-map argument, per promotion and weight copy; kept alive while timed.
    maps = {name: [weight_map(w, rows, promotion) for w in weights] for name, promotion in PROMOTIONS.items()}
    times = {name: [] for name in PROMOTIONS}
    for round_index in range(rounds):
        names = list(PROMOTIONS)
        names = names[round_index % len(names):] + names[:round_index % len(names)]  # rotate who goes first
        for name in names:
            for projection, device_map in zip(projections, maps[name]):
                projection.extra[batch] = (cutlass.Int64(device_map.data_ptr()),)
            times[name].append(graph_time_us(lambda i: projections[i].run(x, outs[i]), copies))
    return projections[0].policies[batch], times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}: median us over {args.rounds} rounds (min-max), back to back, cold L2")
    print(f"{'cell':<22} {'tactic':<20}" + "".join(f"{name:>20}" for name in PROMOTIONS) + f"{'128B/256B':>11}")
    for n, k, batch in CELLS:
        tactic, times = time_cell(n, k, batch, args.rounds)
        spans = {name: f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})" for name, t in times.items()}
        ratio = statistics.median(times["128B"]) / statistics.median(times["256B"])
        label = tactic.label
        print(f"{n}x{k} M={batch:<8} {label:<20}" + "".join(f"{s:>20}" for s in spans.values()) + f"{ratio:11.3f}")


if __name__ == "__main__":
    main()
