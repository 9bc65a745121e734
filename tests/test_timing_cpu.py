"""Timing helpers that need no GPU: CUDA graphs, events and glue kernels stood in for where needed."""

import pytest
import torch

from decode_projection.measure import timing
from decode_projection.measure.checks import Reference
from decode_projection.measure.timing import foreign_kernel, whole_rotations


def test_glue_kernel_refuses_the_cpu():
    # A CPU tensor would put nothing on the GPU between the launches the glue should separate.
    with pytest.raises(ValueError, match="CUDA device"):
        foreign_kernel("cpu")


def test_every_timed_replay_rotates_through_whole_sets_of_copies():
    for copies in range(2, 60):
        launches = whole_rotations(copies)
        assert launches % copies == 0 and launches >= max(40, 2 * copies) and launches < max(40, 2 * copies) + copies


class FakeClock:
    """Stands in for CUDA graphs and events: a graph replays its launch once; each call adds its cost."""

    def __init__(self, monkeypatch):
        self.us, self.captured = 0.0, []
        monkeypatch.setattr(timing, "_captured", self.capture)
        monkeypatch.setattr(timing, "_replay_us", self.replay_us)

    def cost(self, us):
        """A launch (or separator) that takes ``us``."""
        return lambda *_: setattr(self, "us", self.us + us)

    def capture(self, launch, copies):
        graph = type("Graph", (), {"replay": lambda _: launch(0)})()
        self.captured.append(graph)
        return graph, 1

    def replay_us(self, graph, launches):
        before = self.us
        graph.replay()
        return self.us - before


def test_each_separator_is_timed_alone_once_and_taken_off_the_launches_it_separates(monkeypatch):
    clock = FakeClock(monkeypatch)
    norm, plain = clock.cost(3.0), clock.cost(5.0)
    launches = {"a": clock.cost(10.0), "b": clock.cost(20.0), "c": clock.cost(10.0), "d": clock.cost(7.0)}
    times = timing.interleaved_time_us(launches, 2, repeats=3, separators={"a": norm, "b": norm, "c": plain, "d": None})
    assert times == {"a": 10.0, "b": 20.0, "c": 10.0, "d": 7.0}
    assert len(clock.captured) == 4 + 2  # the launches, then each separator alone
    with pytest.raises(ValueError, match="not timed"):
        timing.interleaved_time_us(launches, 2, separators={"e": norm})


class FakeGlue:
    """The PDL-aware glue on the CPU: copies ``source`` into ``x``, remembering what ``x`` held before it ran."""

    def __init__(self, source, x):
        self.source, self.x, self.before = source, x, None

    def __call__(self):
        self.before = self.x.clone()
        self.x.copy_(self.source)


@pytest.fixture
def cpu_contexts(monkeypatch):
    """LaunchContexts on the CPU: both glue kernels replaced, the plain one by a no-op."""
    glues = []
    monkeypatch.setattr(timing, "pdl_glue", lambda source, x: glues.append(FakeGlue(source, x)) or glues[-1])
    monkeypatch.setattr(timing, "foreign_kernel", lambda device: lambda: None)
    return glues


def test_the_check_in_every_context_catches_a_launch_that_reads_x_before_the_glue_wrote_it(cpu_contexts):
    x, weight = torch.randn(4, 64, dtype=torch.float64), torch.randn(16, 64, dtype=torch.float64)
    around = timing.LaunchContexts(list(timing.CONTEXTS), x)
    (glue,) = cpu_contexts
    out = torch.empty(4, 16, dtype=torch.float64)
    reference = Reference(x, weight, torch.float32)
    after_wait = lambda i: torch.matmul(x, weight.T, out=out)  # noqa: E731
    around.check(after_wait, out, reference, label="waits")
    assert torch.equal(x, around.source)  # the glue restored x after poisoning it
    # A launch that read x before its wait sees what x held before the glue ran: the poison.
    glue.before = None
    before_wait = lambda i: torch.matmul(x if glue.before is None else glue.before, weight.T, out=out)  # noqa: E731
    with pytest.raises(AssertionError, match=r"early \(pdl-glue\)"):
        around.check(before_wait, out, reference, label="early")
    # Without the pdl-glue context nothing rewrites x, and nothing is poisoned.
    glue.before = None
    timing.LaunchContexts(["chain", "glue"], x).check(before_wait, out, reference, label="chain and glue")
    with pytest.raises(ValueError, match="launch contexts must be some of"):
        timing.LaunchContexts(["isolated"], x)


def test_every_launch_is_timed_in_every_context_less_its_glue(cpu_contexts, monkeypatch):
    clock = FakeClock(monkeypatch)
    monkeypatch.setattr(timing, "pdl_glue", lambda source, x: clock.cost(3.0))
    monkeypatch.setattr(timing, "foreign_kernel", lambda device: clock.cost(5.0))
    around = timing.LaunchContexts(list(timing.CONTEXTS), torch.zeros(1, 8))
    times = around.time_us({"ours": clock.cost(10.0), "theirs": clock.cost(12.0)}, 2, repeats=3)
    assert times == {(context, name): us for context in timing.CONTEXTS
                     for name, us in (("ours", 10.0), ("theirs", 12.0))}
    assert len(clock.captured) == 3 * 2 + 2


def test_geometric_mean_needs_positive_values():
    assert abs(timing.geometric_mean([2.0, 8.0]) - 4.0) < 1e-12
    for values in ([], [1.0, 0.0], [-1.0]):
        with pytest.raises(ValueError, match="positive"):
            timing.geometric_mean(values)
