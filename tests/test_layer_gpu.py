"""GPU tests of ProjectionLinear: correctness, fallbacks, torch.compile(fullgraph=True) and CUDA graphs."""

import pytest
import torch
from torch import nn

from decode_projection.layer import ProjectionLinear
from decode_projection.measure.checks import assert_close_to_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def poisoned_allocations():
    """Every ``torch.empty`` starts as NaN, the layer's own outputs included: a row the kernel skips shows."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # fills uninitialized memory; warns, never refuses
    assert torch.isnan(torch.empty(4, device="cuda", dtype=torch.bfloat16)).all()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def captured(module, x):
    """``(graph, out)``: ``module(x)`` captured in a CUDA graph after one eager call (modules load outside it)."""
    module(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = module(x)
    return graph, out


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ProjectionLinear(torch.randn(3072, 1536, device="cuda", dtype=torch.bfloat16), batches=(1, 4, 8))
        self.down = ProjectionLinear(torch.randn(1536, 3072, device="cuda", dtype=torch.bfloat16) / 50,
                                     torch.randn(1536, device="cuda", dtype=torch.bfloat16), batches=(1, 4, 8))

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_matches_linear_for_any_leading_shape():
    linear = nn.Linear(1536, 2304, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = ProjectionLinear.from_linear(linear, batches=(1, 8))
    x = torch.randn(2, 4, 1536, device="cuda", dtype=torch.bfloat16)
    out = layer(x)
    assert out.shape == (2, 4, 2304) and not layer.fallbacks
    assert_close_to_reference(out.reshape(8, -1), x.reshape(8, -1), layer.weight, label="layer")


def test_runs_under_inference_mode():
    """Engines decode under torch.inference_mode(): the layer's output is then an inference tensor."""
    layer = ProjectionLinear(torch.randn(2304, 1536, device="cuda", dtype=torch.bfloat16), batches=(4,))
    x = torch.randn(4, 1536, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        out = layer(x)
    assert out.is_inference() and not layer.fallbacks
    assert_close_to_reference(out, x, layer.weight, label="inference mode")


def test_unprepared_batch_falls_back_and_is_counted():
    layer = ProjectionLinear(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16), batches=(1, 8))
    x = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(layer(x), x @ layer.weight.T)
    assert layer.fallbacks["batch without a tactic"] == 1


def test_batch_invariant_layer_runs_every_batch_in_the_order_of_one_row():
    """Batches it holds no tactic for run in held batches (8, then 5 rows padded to 8): each row's bits are
    those it gets alone."""
    layer = ProjectionLinear(torch.randn(2112, 7168, device="cuda", dtype=torch.bfloat16), batches=(1, 8),
                             batch_invariant=True)
    x = torch.randn(13, 7168, device="cuda", dtype=torch.bfloat16)
    together = layer(x)
    alone = torch.cat([layer(x[row : row + 1]) for row in range(13)])
    assert torch.equal(together, alone) and not layer.fallbacks
    assert_close_to_reference(together, x, layer.weight, label="batch-invariant layer, 13 rows")


def test_moving_and_replacing_the_weight_reprepare():
    layer = ProjectionLinear(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16), batches=(4,))
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    layer.cpu()
    assert layer.prepared is None
    layer(x.cpu())
    layer.cuda()
    assert layer.prepared is not None
    layer.weight = nn.Parameter(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16), requires_grad=False)
    assert_close_to_reference(layer(x), x, layer.weight, label="replaced weight")
    assert layer.fallbacks["unsupported device or dtype"] == 1


def test_a_weight_replaced_through_data_is_prepared_again_but_not_while_capturing():
    layer = ProjectionLinear(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16), batches=(4,))
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    layer.weight.data = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    assert_close_to_reference(layer(x), x, layer.weight, label="weight replaced through .data")
    assert not layer.fallbacks
    layer.weight.data = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="call prepare\\(\\) before capturing"):
        with torch.cuda.graph(graph):
            layer(x)


def test_torch_compile_fullgraph_runs_the_kernel():
    model = TwoLayers()
    x = torch.randn(4, 1536, device="cuda", dtype=torch.bfloat16)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager)
    # Compiled and eager agree, and eager is right (against float64; the epilogue adds the down layer's bias).
    hidden = model.up(x)
    assert_close_to_reference(hidden, x, model.up.weight, label="up")
    assert_close_to_reference(model.down(torch.relu(hidden)), torch.relu(hidden), model.down.weight, label="down",
                              addend=model.down.bias[None, :])
    assert not model.up.fallbacks and not model.down.fallbacks


def test_cuda_graph_capture_of_a_model():
    model = TwoLayers()
    x = torch.randn(8, 1536, device="cuda", dtype=torch.bfloat16)
    graph, out = captured(model, x)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    assert not model.up.fallbacks


def test_a_captured_layer_computes_with_new_values_copied_into_its_weight():
    """Copied in place, or loaded without assign: the graph replays with the new values, as one over nn.Linear does.
    A weight of new storage (assigned, loaded with assign=True, a cast) warns that graphs must be captured again;
    until then they compute with the old weight, which the layer keeps (never with freed memory)."""
    layer = ProjectionLinear(torch.randn(2304, 1536, device="cuda", dtype=torch.bfloat16), batches=(8,))
    x = torch.randn(8, 1536, device="cuda", dtype=torch.bfloat16)

    def fresh():
        return torch.randn(2304, 1536, device="cuda", dtype=torch.bfloat16)

    def replay(graph, out):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        return out

    graph, out = captured(layer, x)
    updates = {
        "copied in place": lambda: layer.weight.data.copy_(fresh()),
        "loaded without assign": lambda: layer.load_state_dict({"weight": fresh()}),
    }
    for label, update in updates.items():
        update()
        assert_close_to_reference(replay(graph, out), x, layer.weight, label=f"graph replayed after a weight {label}")
    swaps = {
        "assigned": lambda: setattr(layer, "weight", nn.Parameter(fresh(), requires_grad=False)),
        "loaded with assign=True": lambda: layer.load_state_dict({"weight": fresh()}, assign=True),
    }
    for label, swap in swaps.items():
        old_weight = layer.weight.detach().clone()
        with pytest.warns(UserWarning, match="capture them again"):
            swap()
        junk = torch.full((2304, 1600), 7.0, device="cuda", dtype=torch.bfloat16)  # would take a freed weight's memory
        assert_close_to_reference(replay(graph, out), x, old_weight, label=f"old graph after a weight {label}")
        assert_close_to_reference(layer(x), x, layer.weight, label=f"eager after a weight {label}")
        graph, out = captured(layer, x)
        assert_close_to_reference(replay(graph, out), x, layer.weight, label=f"graph captured after a weight {label}")
        del junk
    assert not layer.fallbacks
    with pytest.warns(UserWarning, match="capture them again"):
        layer.half()
    assert_close_to_reference(layer(x.half()), x.half(), layer.weight, label="after the cast")


def test_a_new_bias_gets_a_new_projection_and_a_captured_graph_is_warned_about():
    """The bias's pointer is an argument of every captured launch: a bias of new storage cannot reach the kernel a
    graph holds, so the layer prepares a new projection and warns, as for a weight of new storage; the graph goes
    on adding the old bias, which the layer keeps."""
    import warnings

    from decode_projection.layer import RECAPTURE_WARNING

    layer = ProjectionLinear(torch.randn(2304, 1536, device="cuda", dtype=torch.bfloat16),
                             torch.randn(2304, device="cuda", dtype=torch.bfloat16), batches=(4,))
    x = torch.randn(4, 1536, device="cuda", dtype=torch.bfloat16)
    graph, out = captured(layer, x)
    first, old_bias = layer.prepared, layer.bias.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer.bias = torch.nn.Parameter(torch.randn(2304, device="cuda", dtype=torch.bfloat16), requires_grad=False)
    assert layer.prepared is not first and any(RECAPTURE_WARNING in str(w.message) for w in caught)
    assert_close_to_reference(layer(x), x, layer.weight, addend=layer.bias.double()[None, :], label="new bias")
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(out, x, layer.weight, addend=old_bias.double()[None, :], label="old graph, old bias")
