"""A toy decoder-style block of Kimi-K3 projections, as CUDA graphs for batches 1..64.

The same block is built twice, with ProjectionLinear and with nn.Linear
(cuBLAS), from the same weights; each is captured in a CUDA graph per padded
batch and the step time of graph replay is printed side by side. The weights
rotate across several copies of the block so that the L2 stays cold, as it is
in a real decode step that streams all layers' weights.

    python examples/decoder_block.py
"""

import statistics

import torch
from torch import nn

from decode_projection.layer import ProjectionLinear

BATCHES = (1, 2, 4, 8, 16, 32, 64)
COPIES = 3  # ~3 x 88 MB of weights: more than 3x the H200's L2


class Block(nn.Module):
    """qkv_a -> q_b -> o_proj, then a dense MLP (gate_up -> down), with residuals."""

    def __init__(self, make):
        super().__init__()
        self.qkv_a, self.q_b, self.o_proj = make(2112, 7168), make(2304, 1536), make(7168, 1536)
        self.gate_up, self.down = make(8448, 7168), make(7168, 4224)

    def forward(self, h):
        latent = self.qkv_a(h)[..., :1536]
        q = self.q_b(latent)[..., :1536]
        h = h + self.o_proj(q)
        gate, up = self.gate_up(h).split(4224, dim=-1)
        return h + self.down(torch.nn.functional.silu(gate) * up)


def linear_from(weights):
    """A factory of nn.Linear layers taking the given weights in order."""
    def make(n, k):
        layer = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        layer.weight.data.copy_(weights.pop(0))
        return layer
    return make


def step_time_us(blocks, batch):
    """Median microseconds of one replayed step (each block copy once per graph)."""
    h = torch.randn(batch, 7168, device="cuda", dtype=torch.bfloat16) / 4
    for block in blocks:
        block(h)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(4):
            for block in blocks:
                h = block(h) / 2
    samples = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / (4 * len(blocks)))
    return statistics.median(samples)


def main():
    torch.manual_seed(0)
    ours, cublas = [], []
    for _ in range(COPIES):
        weights = []

        def make(n, k):
            weights.append(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
            return ProjectionLinear(weights[-1], batches=BATCHES)

        ours.append(Block(make))
        cublas.append(Block(linear_from(list(weights))))
    print(f"{torch.cuda.get_device_name()}: one block step (5 projections), CUDA-graph replay, cold L2")
    print(f"{'batch':>5} {'ProjectionLinear us':>20} {'nn.Linear us':>13} {'speedup':>8}")
    for batch in BATCHES:
        a, b = step_time_us(ours, batch), step_time_us(cublas, batch)
        print(f"{batch:>5} {a:20.1f} {b:13.1f} {b / a:7.2f}x")
    fallbacks = sum(sum(layer.fallbacks.values()) for block in ours for layer in block.children())
    print(f"fallbacks to F.linear: {fallbacks}")


if __name__ == "__main__":
    main()
