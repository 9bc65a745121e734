"""Timing microsecond kernels honestly: cold L2, CUDA-graph replay, medians.

A decode weight of tens of MB fits in the H200's 60 MB L2, so timing one weight
in a loop measures the cache. Every timed launch here reads a different copy of
the weight, rotating through enough copies to exceed 3x the L2; the launches
are captured in one CUDA graph so launch gaps do not pollute the numbers, and
the median over repeated replays is reported per launch. Launches that are
compared with each other are replayed in turn, round by round.

What runs just before a launch changes its time (a kernel with programmatic
dependent launch overlaps its prologue with its predecessor's tail), so every
provider is timed in the launch contexts of CONTEXTS.
"""

import math
import statistics

import torch

from .glue import pdl_glue

CHAIN, PDL_GLUE, GLUE = "chain", "pdl-glue", "glue"
# What every timed launch follows, by context name, in the default order. In a model a projection follows a norm
# or an activation: the glue kernels stand in for those, and their own time, measured alone, is subtracted.
CONTEXTS = {
    CHAIN: "back to back, after a launch of itself",
    PDL_GLUE: "after a PDL-aware elementwise kernel that writes its activations (glue.py)",
    GLUE: "after a plain PyTorch elementwise kernel, which triggers nothing",
}


def geometric_mean(values) -> float:
    """The geometric mean of positive ``values``: how the benchmark sums up speedups and the tuner scores times."""
    values = list(values)
    if not values or min(values) <= 0:
        raise ValueError(f"a geometric mean needs positive values, got {values}")
    # The root of the product, not exp of the mean log: equal values keep their exact mean (a tie stays a tie).
    return math.prod(values) ** (1 / len(values))


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


def interleaved_time_us(launches: dict, copies: int, *, repeats: int = 15, separators: dict | None = None) -> dict:
    """Median microseconds per launch for each ``name: launch(i)``, cold L2, CUDA-graph replay; ``separators``
    (``{name: separator()}``) run a small kernel before every launch of those names, whose own time is taken off."""
    # The graphs replay in turn (a rotating order, one timed replay each per round), so drift and what ran before
    # fall on every launch alike: timed one after the other, torch.matmul's time on small weights moved by up to
    # 12% with what ran before it (scripts/timing_order.py). Each timed replay follows an untimed one of the same
    # graph: on the H200 the first replay of our graph after torch.matmul's ran up to 0.5 us per launch slower,
    # and the second matched our graph timed alone (two graphs of our own kernel alternated at no cost).
    # A separator stands in for the glue before a projection in a model (see CONTEXTS); it is timed alone, back to
    # back with itself, in the same rounds, once however many launches it separates.
    separators = {name: separator for name, separator in (separators or {}).items() if separator is not None}
    if set(separators) - set(launches):
        raise ValueError(f"separators for launches not timed: {sorted(map(str, set(separators) - set(launches)))}")
    timed = {name: _after(separators[name], launch) if name in separators else launch
             for name, launch in launches.items()}
    alone = {separator: (_SEPARATOR, index) for index, separator in enumerate(dict.fromkeys(separators.values()))}
    timed.update({key: _alone(separator) for separator, key in alone.items()})
    graphs = {name: _captured(launch, copies) for name, launch in timed.items()}
    names = list(graphs)
    samples = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            if len(names) > 1:
                graphs[name][0].replay()  # untimed: the first replay after another graph's pays for the switch
            samples[name].append(_replay_us(*graphs[name]))
    medians = {name: statistics.median(found) for name, found in samples.items()}
    return {name: medians[name] - (medians[alone[separators[name]]] if name in separators else 0.0)
            for name in launches}


_SEPARATOR = object()  # marks a separator's own entry among the launches timed


def _after(separator, launch):
    """``launch`` with ``separator`` run before every call."""
    def separated(i):
        separator()
        launch(i)
    return separated


def _alone(separator):
    """``separator`` as a launch of its own."""
    return lambda i: separator()


def graph_time_us(launch, copies: int, *, repeats: int = 15, separator=None) -> float:
    """Median microseconds per launch of ``launch(i)`` timed alone (see interleaved_time_us)."""
    return interleaved_time_us({0: launch}, copies, repeats=repeats, separators={0: separator})[0]


def foreign_kernel(device):
    """A small elementwise kernel on CUDA ``device``, standing in for the glue between projections in a model."""
    device = torch.device(device)
    if device.type != "cuda":
        # On the CPU it would put nothing between the launches it is meant to separate.
        raise ValueError(f"the glue kernel must run on a CUDA device, got {device}")
    scratch = torch.zeros(4096, device=device)
    return lambda: scratch.add_(1.0)


class LaunchContexts:
    """The launch contexts that launches reading activations ``x`` are checked and timed in, and what runs
    before them in each: nothing in a chain, the PDL-aware glue (which rewrites ``x``), or a plain kernel."""

    def __init__(self, contexts, x):
        unknown = [context for context in contexts if context not in CONTEXTS]
        if unknown or not contexts:
            raise ValueError(f"launch contexts must be some of {list(CONTEXTS)}, got {list(contexts)}")
        self.x = x
        self.source = x.clone()  # what the PDL-aware glue copies into x: x keeps its values
        self.separators = {context: self._separator(context) for context in contexts}

    def _separator(self, context):
        """What runs before every launch in ``context``, or None."""
        if context == PDL_GLUE:
            return pdl_glue(self.source, self.x)
        if context == GLUE:
            return foreign_kernel(self.x.device)
        return None

    def check(self, launch, out, reference, label):
        """Judge ``launch(0)``, which writes ``out``, against ``reference`` (of ``x``) in every context, with
        ``out`` poisoned (NaN) before; before the PDL-aware glue ``x`` is poisoned too, so a launch that read
        ``x`` before its own wait would read NaN."""
        for context, separator in self.separators.items():
            out.fill_(float("nan"))
            if context == PDL_GLUE:
                self.x.fill_(float("nan"))
            if separator is not None:
                separator()
            launch(0)
            if context == PDL_GLUE and not torch.equal(self.x, self.source):
                raise AssertionError(f"{label} ({context}): the glue did not write x")
            reference.check(out, label=f"{label} ({context})")

    def time_us(self, launches: dict, copies: int, *, repeats: int = 15) -> dict:
        """``{(context, name): median us}`` of every ``name: launch(i)`` in every context, in one interleaved
        measurement (interleaved_time_us)."""
        return interleaved_time_us(
            {(context, name): launch for context in self.separators for name, launch in launches.items()}, copies,
            repeats=repeats,
            separators={(context, name): separator for context, separator in self.separators.items()
                        for name in launches},
        )
