"""Exploratory tactic sweep (cold L2, graph replay): data for the heuristic and the tuner."""

import itertools
import math

import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.splitk import max_stages
from scripts.speed_check import graph_time_us

SHAPES = [(2112, 7168), (7168, 1536), (6288, 7168), (2304, 1536)]
BATCHES = (1, 32)

l2 = torch.cuda.get_device_properties(0).L2_cache_size
for (n, k), batch in itertools.product(SHAPES, BATCHES):
    copies = max(2, math.ceil(3 * l2 / (n * k * 2)) + 1)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    cublas = graph_time_us(lambda i: torch.matmul(x, weights[i].T, out=outs[i]), copies)
    acts = max(8, 1 << (batch - 1).bit_length())
    results = []
    for rows, split in itertools.product((64, 128), (1, 2, 4, 8)):
        for stages in sorted({4, 8, max_stages(rows, acts, split)}):
            tactic = SplitKTactic(rows, acts, split, stages)
            if not tactic.valid:
                continue
            projections = [PreparedProjection(w, {batch: tactic}).prepare() for w in weights]
            results.append((graph_time_us(lambda i: projections[i].run(x, outs[i]), copies), tactic))
    results.sort(key=lambda r: r[0])
    print(f"{n}x{k} M={batch}: cuBLAS {cublas:.2f} us; best:", flush=True)
    for time_us, tactic in results[:5]:
        print(f"   {time_us:7.2f} us  ({tactic.weight_rows},{tactic.activation_rows},{tactic.split},{tactic.stages})")
    print(f"   worst {results[-1][0]:.2f} us {results[-1][1]}", flush=True)
