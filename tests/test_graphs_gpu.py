"""GPU tests of weight lifetimes: CUDA graphs across an in-place update and a re-prepare, and projections dropped
mid-queue."""

import gc

import pytest
import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.measure.checks import assert_close_to_reference

pytestmark = pytest.mark.gpu

TACTIC = SplitKTactic(64, 8, 2, 4)


def test_a_graph_reads_a_weight_updated_in_place_and_keeps_the_old_one_after_a_new_weight():
    n, k, batch = 1024, 2048, 4
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    prepared = PreparedProjection(weight, {batch: TACTIC}).prepare()
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    captured = torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    prepared.run(x, captured)  # loads the module outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prepared.run(x, captured)

    # New values in the same storage: the graph's map describes that storage.
    weight.copy_(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    captured.fill_(float("nan"))
    graph.replay()
    eager = prepared.run(x, torch.empty(batch, n, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert_close_to_reference(captured, x, weight, label="graph replayed after an in-place weight update")

    # A weight of new storage (another dtype too): new kernels; the graph keeps computing with the weight it captured,
    # which the projection keeps alive.
    reference = weight.clone()
    prepared.weight = torch.randn(n, k, device="cuda", dtype=torch.float16)
    prepared.prepare()
    del weight
    gc.collect()
    junk = torch.full((n, k + 64), 7.0, device="cuda", dtype=torch.bfloat16)  # would take a freed weight's memory
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(captured, x, reference, label="graph replayed after a new weight")
    x16 = x.half()
    out = prepared.run(x16, torch.empty(batch, n, device="cuda", dtype=torch.bfloat16))
    assert_close_to_reference(out, x16, prepared.weight, label="eager after a new weight")
    del junk


def test_dropping_a_projection_with_launches_queued_on_a_side_stream():
    """The launches queued on another stream read what they were launched with: the weight's map travels by value
    with each launch, so dropping the plain projection they came from (its weight is the caller's) changes nothing
    they read while they wait."""
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
    replacements = [PreparedProjection(other, {4: TACTIC}).prepare() for other in others]
    still_queued = not side.query()
    side.synchronize()
    assert still_queued, "the side stream was done before the new projections were prepared: sleep longer"
    for out in outs:
        assert torch.equal(out, expected)
    assert len(replacements) == 64
