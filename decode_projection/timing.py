"""Timing microsecond kernels honestly: cold L2, CUDA-graph replay, medians.

A decode weight of tens of MB fits in the H200's 60 MB L2, so timing one weight
in a loop measures the cache. Every timed launch here reads a different copy of
the weight, rotating through enough copies to exceed 3x the L2; the launches
are captured in one CUDA graph so launch gaps do not pollute the numbers, and
the median over repeated replays is reported per launch.
"""

import math
import statistics

import torch


def cold_copies(weight_bytes: int, device=None) -> int:
    """How many weight copies to rotate through so that they exceed 3x the L2."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(2, math.ceil(3 * l2 / weight_bytes) + 1)


def _replay_median_us(launch, copies: int, repeats: int) -> float:
    """Median microseconds per ``launch(i)`` over graph replays rotating ``copies``."""
    launches = max(2 * copies, 40)
    for i in range(copies):
        launch(i)  # warm-up outside the graph: module load, descriptors, handles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            launch(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / launches)
    del graph
    return statistics.median(samples)


def graph_time_us(launch, copies: int, *, repeats: int = 15, separator=None, separator_us=None) -> float:
    """Median microseconds per launch of ``launch(i)``, cold L2, CUDA-graph replay.

    Back to back, a kernel that uses programmatic dependent launch overlaps its
    prologue with the previous launch of itself. In a model the previous kernel
    is usually something else (a norm, an activation), so with ``separator`` a
    small kernel runs before every launch, as that glue would; its own time,
    measured alone the same way (or given as ``separator_us``), is subtracted.
    """
    if separator is None:
        return _replay_median_us(launch, copies, repeats)

    def separated(i):
        separator()
        launch(i)

    if separator_us is None:
        separator_us = _replay_median_us(lambda i: separator(), copies, repeats)
    return _replay_median_us(separated, copies, repeats) - separator_us


def foreign_kernel(device=None):
    """A small elementwise kernel standing in for the glue between projections in a model."""
    scratch = torch.zeros(4096, device=device)
    return lambda: scratch.add_(1.0)
