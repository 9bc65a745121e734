"""Timing microsecond kernels honestly: cold L2, CUDA-graph replay, medians.

A decode weight of tens of MB fits in the H200's 60 MB L2, so timing one weight
in a loop measures the cache. Every timed launch here reads a different copy of
the weight, rotating through enough copies to exceed 3x the L2; the launches
are captured in one CUDA graph so launch gaps do not pollute the numbers, and
the median over repeated replays is reported per launch. Launches that are
compared with each other are replayed in turn, round by round.
"""

import math
import statistics

import torch


def cold_copies(weight_bytes: int, device=None) -> int:
    """How many weight copies to rotate through so that they exceed 3x the L2."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(2, math.ceil(3 * l2 / weight_bytes) + 1)


def whole_rotations(copies: int) -> int:
    """Launches per timed graph: at least 40 and two rotations of the copies, in whole rotations."""
    # A replay that ended partway through a rotation would start the next replay on copies read a few launches
    # before, still in L2 (7168 x 768 rotates 19 copies, which 40 launches would cut at 2).
    return copies * math.ceil(max(2 * copies, 40) / copies)


def _captured(launch, copies: int):
    """(graph, launches): ``launch(i)`` captured rotating ``copies``, warmed up and replayed once."""
    launches = whole_rotations(copies)
    for i in range(copies):
        launch(i)  # warm-up outside the graph: module load, descriptors, handles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            launch(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    return graph, launches


def _replay_us(graph, launches: int) -> float:
    """Microseconds per launch of one replay of ``graph``."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / launches


def interleaved_time_us(launches: dict, copies: int, *, repeats: int = 15, separator=None) -> dict:
    """Median microseconds per launch for each ``name: launch(i)``, cold L2, CUDA-graph replay."""
    # The graphs replay in turn (a rotating order, one timed replay each per round), so drift and what ran before
    # fall on every launch alike: timed one after the other, torch.matmul's time on small weights moved by up to
    # 12% with what ran before it (scripts/timing_order.py). Each timed replay follows an untimed one of the same
    # graph: on the H200 the first replay of our graph after torch.matmul's ran up to 0.5 us per launch slower,
    # and the second matched our graph timed alone (two graphs of our own kernel alternated at no cost).
    # Back to back, a kernel that uses programmatic dependent launch overlaps its prologue with the previous
    # launch of itself. In a model the previous kernel is usually something else (a norm, an activation), so with
    # ``separator`` a small kernel runs before every launch, as that glue would; its own time, measured alone in
    # the same rounds, is subtracted.
    if separator is not None:
        launches = {name: _after(separator, launch) for name, launch in launches.items()}
        launches[_SEPARATOR] = lambda i: separator()
    graphs = {name: _captured(launch, copies) for name, launch in launches.items()}
    names = list(graphs)
    samples = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            if len(names) > 1:
                graphs[name][0].replay()  # untimed: the first replay after another graph's pays for the switch
            samples[name].append(_replay_us(*graphs[name]))
    medians = {name: statistics.median(found) for name, found in samples.items()}
    separator_us = medians.pop(_SEPARATOR, 0.0)
    return {name: us - separator_us for name, us in medians.items()}


_SEPARATOR = object()  # the separator's own entry among the launches timed


def _after(separator, launch):
    """``launch`` with ``separator`` run before every call."""
    def separated(i):
        separator()
        launch(i)
    return separated


def graph_time_us(launch, copies: int, *, repeats: int = 15, separator=None) -> float:
    """Median microseconds per launch of ``launch(i)`` timed alone (see interleaved_time_us)."""
    return interleaved_time_us({0: launch}, copies, repeats=repeats, separator=separator)[0]


def foreign_kernel(device):
    """A small elementwise kernel on CUDA ``device``, standing in for the glue between projections in a model."""
    device = torch.device(device)
    if device.type != "cuda":
        # On the CPU it would put nothing between the launches it is meant to separate.
        raise ValueError(f"the glue kernel must run on a CUDA device, got {device}")
    scratch = torch.zeros(4096, device=device)
    return lambda: scratch.add_(1.0)
