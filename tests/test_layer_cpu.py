"""CPU tests of ProjectionLinear: the fake op for tracing, and counted fallbacks."""

import gc
import logging
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from decode_projection import projection
from decode_projection.layer import ProjectionLinear, project


def test_fake_implementation_gives_shape_and_dtype():
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    x = torch.empty(3, 5, 64, device="meta", dtype=torch.bfloat16)
    weight = torch.empty(48, 64, device="meta", dtype=torch.bfloat16)
    out = project(x, weight, None, layer.handle, torch.float32, 48)
    assert out.shape == (3, 5, 48) and out.dtype == torch.float32 and out.device.type == "meta"


def test_opcheck_on_the_fallback_path():
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    torch.library.opcheck(project, (x, layer.weight, None, layer.handle, torch.bfloat16, 48),
                          test_utils=("test_schema", "test_faketensor"))


def test_cpu_module_falls_back_and_counts():
    linear = nn.Linear(64, 48, bias=True, dtype=torch.bfloat16)
    layer = ProjectionLinear.from_linear(linear)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    assert layer.prepared is None
    torch.testing.assert_close(layer(x), linear(x))
    assert layer.fallbacks["unsupported device or dtype"] == 1
    assert "out_features=48" in repr(layer)


def test_copies_get_their_own_handle():
    import copy

    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    twin = copy.deepcopy(layer)
    assert twin.handle != layer.handle
    twin(torch.randn(2, 64, dtype=torch.bfloat16))
    assert twin.fallbacks and not layer.fallbacks


def test_non_hopper_gpu_falls_back(monkeypatch):
    from decode_projection import layer as layer_module

    def refuse(device):
        raise ValueError("device cuda:0 has compute capability 8.0")

    monkeypatch.setattr(layer_module, "architecture", refuse)
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    layer.weight.data = layer.weight.data  # stays on the CPU: nothing to prepare
    assert layer.prepared is None
    # Pretend the weight is on a GPU the kernel does not support.
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    layer.prepare()
    monkeypatch.undo()
    assert layer.prepared is None and "8.0" in layer.unsupported


def test_bad_configuration_is_refused_at_construction():
    import pytest

    weight = torch.randn(48, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="output dtype"):
        ProjectionLinear(weight, output_dtype=torch.float64)
    with pytest.raises(ValueError, match="positive ints"):
        ProjectionLinear(weight, batches=(0, 4))
    with pytest.raises(TypeError, match="torch.Tensor, got list"):
        ProjectionLinear([[1.0] * 64] * 48)
    with pytest.raises(ValueError, match=r"2-D \[N, K\], got shape \(48,\)"):
        ProjectionLinear(torch.randn(48, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        ProjectionLinear(weight, [0.0] * 48)
    for bias in (torch.zeros(47, dtype=torch.bfloat16), torch.zeros(48)):
        with pytest.raises(ValueError, match=r"bias must be \(48,\) torch.bfloat16"):
            ProjectionLinear(weight, bias)
    with pytest.raises(TypeError, match="programmatic_launch must be a bool"):
        ProjectionLinear(weight, programmatic_launch="no")
    with pytest.raises(TypeError, match="batch_invariant must be a bool"):
        ProjectionLinear(weight, batch_invariant=1)


def test_a_cast_layer_returns_what_nn_linear_would():
    linear = torch.nn.Linear(64, 48, dtype=torch.bfloat16)
    layer = ProjectionLinear.from_linear(linear)
    x = torch.randn(4, 64)
    assert layer.float()(x).dtype == linear.float()(x).dtype == torch.float32
    assert layer.half().output_dtype == torch.float16  # as nn.Linear's
    assert layer.bfloat16()(x.bfloat16()).dtype == torch.bfloat16
    chosen = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16), output_dtype=torch.float32)
    assert chosen.half().output_dtype == torch.float32 and chosen.bfloat16().output_dtype == torch.float32
    # A weight replaced in place keeps the output dtype: the custom op has allocated its output before it re-prepares.
    layer.weight.data = torch.randn(48, 64, dtype=torch.float16)
    layer.prepare()
    assert layer.output_dtype == torch.bfloat16


def test_a_layer_pickled_before_the_requested_output_dtype_was_kept_still_loads():
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16), output_dtype=torch.float32)
    state = layer.__getstate__()
    del state["requested_output_dtype"]
    loaded = ProjectionLinear.__new__(ProjectionLinear)
    loaded.__setstate__(state)
    assert loaded.half().output_dtype == torch.float32  # taken as asked for, as it was before


def test_a_weight_the_kernel_cannot_take_falls_back_with_the_reason(monkeypatch):
    from decode_projection import layer as layer_module

    monkeypatch.setattr(layer_module, "architecture", lambda device: "sm_90a")
    layer = ProjectionLinear(torch.randn(48, 60, dtype=torch.bfloat16))  # K % 8 != 0
    # Pretend the weight is on a Hopper GPU: a model-wide swap must not die on this layer.
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    layer.prepare()
    monkeypatch.undo()
    assert layer.prepared is None and "16 B TMA pitch" in layer.unsupported


def test_a_second_gpu_falls_back_with_the_reason(monkeypatch):
    from decode_projection import layer as layer_module
    from decode_projection.runtime.gpu import H200

    class ClaimedElsewhere(layer_module.PreparedProjection):
        def prepare(self):
            raise ValueError("this kernel already runs on cuda:0; projections on several GPUs ...")

    monkeypatch.setattr(layer_module, "architecture", lambda device: "sm_90a")
    monkeypatch.setattr(projection, "gpu_spec", lambda device: H200)
    monkeypatch.setattr(layer_module, "PreparedProjection", ClaimedElsewhere)
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 1)), raising=False)
    layer.prepare()
    monkeypatch.undo()
    assert layer.prepared is None and "several GPUs" in layer.unsupported


class HeldBatches:
    """A stand-in for a prepared projection: the batches it holds, and the batches it was run at."""

    def __init__(self, weight, batches):
        self.weight, self.kernels, self.launched = weight, dict.fromkeys(batches), []

    def run(self, x, out):
        assert x.shape[0] in self.kernels and out.shape[0] == x.shape[0]
        self.launched.append(x.shape[0])
        out.copy_(x.double() @ self.weight.double().T)
        return out


def test_batch_invariant_rows_run_in_the_batches_held():
    from decode_projection.layer import run_in_held_batches

    # Small integers: every sum is exact, whatever batch float64 matmul blocks by.
    weight = torch.randint(-8, 8, (48, 64)).double()
    for held, rows, launched in [((1, 8), 13, [8, 8]), ((4, 16), 37, [16, 16, 16]), ((2, 4), 3, [4]), ((8,), 8, [8])]:
        prepared = HeldBatches(weight, held)
        x = torch.randint(-8, 8, (rows, 64)).double()
        out = torch.full((rows, 48), float("nan"), dtype=torch.float64)
        run_in_held_batches(prepared, x, out)
        assert prepared.launched == launched
        torch.testing.assert_close(out, x @ weight.T, rtol=0, atol=0)


def pretend_layers_run_on_hopper(monkeypatch, events):
    """Layers prepared as on an H200 (heuristic or shipped tactics), with a projection that records its prepares
    in ``events`` and never compiles; so are synchronizes. Returns a function that puts every tensor on cuda:0."""
    from decode_projection import layer as layer_module
    from decode_projection.runtime.gpu import H200

    class Prepared(layer_module.PreparedProjection):
        def prepare(self):
            events.append(("prepared", id(self), self.weight.shape, self.weight.dtype))
            return self

    monkeypatch.setattr(layer_module, "architecture", lambda device: "sm_90a")
    monkeypatch.setattr(projection, "gpu_spec", lambda device: H200)
    monkeypatch.setattr(layer_module, "PreparedProjection", Prepared)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("synchronized"))
    return lambda: monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)),
                                       raising=False)


def test_a_weight_in_place_keeps_the_projection_and_new_storage_replaces_it(monkeypatch):
    import pytest

    from decode_projection.layer import RECAPTURE_WARNING

    events = []
    on_gpu = pretend_layers_run_on_hopper(monkeypatch, events)
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    on_gpu()
    layer.prepare()
    first = layer.prepared
    layer.weight.data.copy_(torch.randn(48, 64, dtype=torch.bfloat16))
    layer.prepare()
    # New values in the same storage: CUDA graphs captured before read them through the map they hold.
    assert layer.prepared is first
    assert events == [("prepared", id(first), (48, 64), torch.bfloat16)] * 2
    first._captured_operands.append((first.weight, None))  # as run() notes a launch a graph captured
    old_weight = weakref.ref(first.weight)
    layer.weight.data = torch.randn(48, 64, dtype=torch.bfloat16)  # the same shape, new storage
    with pytest.warns(UserWarning, match="capture them again"):
        layer.prepare()
    second = layer.prepared
    # Eager launches on another stream may still read what the old projection owned: the device is waited for.
    assert second is not first and events[2:] == [("prepared", id(second), (48, 64), torch.bfloat16), "synchronized"]
    del first
    gc.collect()
    assert old_weight() is not None, "the graph captured before reads the old weight: the layer keeps it"
    layer.weight.data = torch.randn(96, 64, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graph captured the second projection
        layer.prepare()
    assert len(layer._kept_for_graphs) == 1
    del layer
    gc.collect()
    assert old_weight() is None
    monkeypatch.undo()
    assert "capture them again" in RECAPTURE_WARNING


def test_a_bias_of_new_storage_replaces_the_projection(monkeypatch):
    import pytest

    events = []
    on_gpu = pretend_layers_run_on_hopper(monkeypatch, events)
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16), torch.randn(48, dtype=torch.bfloat16))
    on_gpu()
    layer.prepare()
    first = layer.prepared
    layer.prepare()
    assert layer.prepared is first  # the same weight and bias storage
    first._captured_operands.append((first.weight, first.bias))  # as run() notes a launch a graph captured
    # A graph captured before holds the old bias's pointer: the layer warns and prepares a new projection.
    with pytest.warns(UserWarning, match="capture them again"):
        layer.bias.data = torch.randn(48, dtype=torch.bfloat16)
        layer.prepare()
    assert layer.prepared is not first and layer.prepared.bias.data_ptr() == layer.bias.data_ptr()
    monkeypatch.undo()


def test_a_bad_tables_variable_raises_instead_of_falling_back(monkeypatch, tmp_path):
    import pytest

    on_gpu = pretend_layers_run_on_hopper(monkeypatch, [])
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    on_gpu()
    for named in (tmp_path / "missing.json", tmp_path):
        monkeypatch.setenv("DECODE_PROJECTION_TABLES", str(named))
        with pytest.raises(ValueError, match=f"DECODE_PROJECTION_TABLES names {named}, which is not a usable table"):
            layer.prepare()


def test_the_first_fallback_of_each_layer_is_logged_with_its_reason(caplog):
    layers = [ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16)) for _ in range(2)]
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="decode_projection"):
        for layer in layers + layers:
            layer(x)
    warned = [record for record in caplog.records if record.name == "decode_projection.layer"]
    assert len(warned) == 2 and all(record.levelno == logging.WARNING for record in warned)
    assert "in_features=64, out_features=48) computes with F.linear: unsupported device or dtype" in warned[0].message
    assert "weight torch.bfloat16 on cpu" in warned[0].message
    assert [layer.fallbacks["unsupported device or dtype"] for layer in layers] == [2, 2]


def test_the_source_of_the_tactics_is_logged_once_per_shape(monkeypatch, caplog):
    on_gpu = pretend_layers_run_on_hopper(monkeypatch, [])
    projection._log_policy_sources.cache_clear()
    layers = [ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16)) for _ in range(2)]
    on_gpu()
    with caplog.at_level(logging.INFO, logger="decode_projection"):
        for layer in layers:
            layer.prepare()
    said = [record.message for record in caplog.records if record.name == "decode_projection.projection"]
    assert said == ["no table for NVIDIA H200 holds 48x64 bfloat16->bfloat16: heuristic tactics"]


def test_a_stale_handle_says_so():
    import pytest

    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    x, weight, handle = torch.randn(2, 64, dtype=torch.bfloat16), layer.weight, layer.handle
    del layer
    gc.collect()
    with pytest.raises(ValueError, match=f"handle {handle} names no live ProjectionLinear"):
        project(x, weight, None, handle, torch.bfloat16, weight.shape[0])


def test_batches_are_positive_ints_and_at_least_one():
    import pytest

    for batches in ((True,), (), (1, 0)):
        with pytest.raises(ValueError, match="ProjectionLinear batches must be positive ints"):
            ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16), batches=batches)


def test_a_compiled_fallback_still_traces_whole_and_counts():
    """Logging inside traced code would break the graph: fullgraph=True must still compile the fallback."""
    layer = ProjectionLinear(torch.randn(48, 64, dtype=torch.bfloat16))
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), x @ layer.weight.T)
    assert layer.fallbacks["unsupported device or dtype"] == 2


def test_a_gated_layer_computes_silu_of_gate_times_up():
    import pytest

    gate, up = nn.Linear(64, 20, bias=False, dtype=torch.bfloat16), nn.Linear(64, 20, bias=False, dtype=torch.bfloat16)
    layer = ProjectionLinear.gated(gate, up, batches=(1, 4))
    assert layer.out_features == 20 and layer.weight.shape == (48, 64) and "gated" in repr(layer)
    x = torch.randn(3, 4, 64, dtype=torch.bfloat16)
    out = layer(x)  # on the CPU: the F.linear form, as the two layers and F.silu(g) * u compute it
    assert out.shape == (3, 4, 20) and out.dtype == torch.bfloat16
    assert torch.equal(out, F.silu(gate(x)) * up(x))
    meta = torch.empty(3, 4, 64, device="meta", dtype=torch.bfloat16)
    assert project(meta, layer.weight.to("meta"), None, layer.handle, torch.bfloat16, 20).shape == (3, 4, 20)
    with pytest.raises(ValueError, match="without a bias"):
        ProjectionLinear.gated(nn.Linear(64, 20, dtype=torch.bfloat16), up)
    with pytest.raises(ValueError, match="takes no bias"):
        ProjectionLinear(layer.weight, torch.zeros(48, dtype=torch.bfloat16), gated_rows=20)


def test_opcheck_on_a_gated_layer_of_a_padded_last_group():
    gate, up = (nn.Linear(64, 20, bias=False, dtype=torch.bfloat16) for _ in range(2))
    layer = ProjectionLinear.gated(gate, up, batches=(1, 4))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    torch.library.opcheck(project, (x, layer.weight, None, layer.handle, torch.bfloat16, 20),
                          test_utils=("test_schema", "test_faketensor"))
    assert layer(x).is_contiguous()
