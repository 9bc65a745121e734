"""GPU tests of descriptor lifetimes: CUDA graphs across a re-prepare, and projections dropped mid-queue."""

import gc

import pytest
import torch

from decode_projection import PreparedProjection, SplitKTactic, projection, runtime
from decode_projection.measure.checks import assert_close_to_reference

pytestmark = pytest.mark.gpu

TACTIC = SplitKTactic(64, 8, 2, 4)


def test_a_graph_computes_with_a_weight_swapped_in_place_and_keeps_the_old_one_after_a_dtype_change():
    n, k, batch = 1024, 2048, 4
    prepared = PreparedProjection(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), {batch: TACTIC}).prepare()
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    captured = torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    prepared.run(x, captured)  # loads the module outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prepared.run(x, captured)

    # The same shape and dtype (another row pitch too): the graph reads the new weight through the same maps.
    swapped = torch.randn(n, k + 64, device="cuda", dtype=torch.bfloat16)[:, :k]
    prepared.weight = swapped
    prepared.prepare()
    captured.fill_(float("nan"))
    graph.replay()
    eager = prepared.run(x, torch.empty(batch, n, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert_close_to_reference(captured, x, swapped, label="graph replayed after an in-place weight swap")

    # Another dtype: new maps and kernels; the graph keeps computing with the weight it last described.
    reference = swapped.clone()
    prepared.weight = torch.randn(n, k, device="cuda", dtype=torch.float16)
    prepared.prepare()
    del swapped
    gc.collect()
    junk = torch.full((n, k + 64), 7.0, device="cuda", dtype=torch.bfloat16)  # would take a freed weight's memory
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(captured, x, reference, label="graph replayed after a dtype change")
    x16 = x.half()
    out = prepared.run(x16, torch.empty(batch, n, device="cuda", dtype=torch.bfloat16))
    assert_close_to_reference(out, x16, prepared.weight, label="eager after a dtype change")
    del junk


def test_dropping_a_projection_with_launches_queued_on_a_side_stream(monkeypatch):
    """Its descriptors stay as they are until the queued launches are done, while new projections take theirs."""
    # A pool of its own: the one the process shares may have to drain the device to hand out a slot.
    monkeypatch.setattr(projection, "tensor_map_slots", runtime.TensorMapSlots())
    weight = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    others = [torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(64)]
    x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)
    dropped = PreparedProjection(weight, {4: TACTIC}).prepare()
    expected = dropped.run(x, torch.empty(4, 1024, device="cuda", dtype=torch.bfloat16)).clone()
    outs = [torch.full((4, 1024), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second of spinning: the launches below wait behind it
        for out in outs:
            dropped.run(x, out)
    del dropped
    gc.collect()
    # From the caching allocator, new descriptors would get the dropped ones' memory at once: it was allocated
    # on the current stream, which never waits for the side stream.
    replacements = [PreparedProjection(other, {4: TACTIC}).prepare() for other in others]
    still_queued = not side.query()
    side.synchronize()
    assert still_queued, "the side stream was done before the new projections were prepared: sleep longer"
    for out in outs:
        assert torch.equal(out, expected)
    assert len(replacements) == 64
