"""First speed check: hand-picked tactics next to torch.matmul, cold L2, CUDA-graph replay."""

import argparse
import math
import statistics

import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.splitk import max_stages
from tests.checks import assert_close_to_reference

# Hand-picked from a sweep on the H200: (weight rows, split) per shape, the deepest
# pipeline that fits; activation rows follow the batch.
PICKS = {(2112, 7168): (64, 2), (7168, 1536): (128, 1), (6288, 7168): (128, 1)}
BATCHES = (1, 8, 32, 64)


def graph_time_us(launch, copies, repeats=15):
    """Median microseconds per launch over CUDA-graph replays that rotate weight copies."""
    launches = max(2 * copies, 40)
    for i in range(copies):
        launch(i)  # warm-up: module load, descriptors, handles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            launch(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / launches)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"GPU: {torch.cuda.get_device_name(0)}, L2 {l2 >> 20} MiB, torch {torch.__version__}")
    print(f"{'N x K':>12} {'M':>4} {'tactic':>22} {'ours us':>8} {'cuBLAS us':>9} {'ours TB/s':>9} {'speedup':>7}")
    for (n, k), (rows, split) in PICKS.items():
        weight_bytes = n * k * 2
        copies = max(2, math.ceil(3 * l2 / weight_bytes) + 1)
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for batch in batches:
            acts = max(8, 1 << (batch - 1).bit_length())
            tactic = SplitKTactic(rows, acts, split, max_stages(rows, acts, split))
            x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
            outs = [torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            projections = [PreparedProjection(w, {batch: tactic}).prepare() for w in weights]
            projections[0].run(x, outs[0])
            assert_close_to_reference(outs[0], x, weights[0], label=f"{n}x{k} M={batch}")
            ours = graph_time_us(lambda i: projections[i].run(x, outs[i]), copies)
            cublas = graph_time_us(lambda i: torch.matmul(x, weights[i].T, out=outs[i]), copies)
            moved = weight_bytes + batch * k * 2 + batch * n * 2
            name = f"({rows},{acts},{split},{tactic.stages})"
            print(
                f"{n:>6}x{k:<5} {batch:>4} {name:>22} {ours:8.2f} {cublas:9.2f} "
                f"{moved / ours / 1e6:9.2f} {cublas / ours:7.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
