"""CPU tests of swap_linears: eligibility reasons, replacement in nested parents, the report, fallbacks found at
run time and handed back to nn.Linear; on a tiny transformers DeepseekV3 where transformers is installed, also the
example's GPU branch with fake graphs and its glue variant."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decode_projection.layer import ProjectionLinear
from decode_projection.swap import SwapReport, replace_module, swap_linears, why_not_swappable

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def anywhere(weight):
    """A device check that takes every device: the CPU stands in for a Hopper GPU."""


class Stacked(nn.Module):
    """A stand-in for the glue's stacked gate/up ProjectionLinear."""

    def __init__(self, weight):
        super().__init__()
        self.weight, self.fallbacks = weight, Counter()

    def forward(self, x):
        return F.linear(x, self.weight)


class Stub(nn.Module):
    """A stand-in for ProjectionLinear: F.linear, counting calls whose rows are not a prepared batch."""

    made = []

    def __init__(self, linear, batches, **options):
        super().__init__()
        self.weight, self.bias, self.batches, self.options = linear.weight, linear.bias, tuple(batches), options
        self.fallbacks = Counter()
        Stub.made.append(self)

    @classmethod
    def from_linear(cls, linear, *, batches, **options):
        return cls(linear, batches, **options)

    def forward(self, x):
        if x.numel() // x.shape[-1] not in self.batches:
            self.fallbacks["batch without a tactic"] += 1
        return F.linear(x, self.weight, self.bias)


def bf16_linear(k, n, bias=False):
    return nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = bf16_linear(64, 64)
        self.expand = bf16_linear(16, 64)  # like kv_b_proj: sees batch x cache rows
        self.cache = nn.Parameter(torch.randn(1, 10, 16, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        keys = self.expand(self.cache.expand(x.shape[0], -1, -1))  # [batch, 10, 64]
        return self.q(x) + keys.mean(dim=1, keepdim=True)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(Attention(), bf16_linear(64, 64, bias=True)) for _ in range(2)])
        self.odd = bf16_linear(12, 8)  # K % 8 != 0
        self.full = nn.Linear(64, 32)  # float32
        self.head = bf16_linear(64, 48)
        self.tied = self.head  # the same layer under a second name

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.tied(x) + self.head(x) + self.full(x.float()).sum(-1, keepdim=True).to(x.dtype)


def test_reasons_for_layers_the_kernel_cannot_take():
    assert why_not_swappable(bf16_linear(64, 32)) == "weight on cpu"
    assert why_not_swappable(bf16_linear(64, 32), device_check=anywhere) is None
    assert why_not_swappable(bf16_linear(64, 32, bias=True), device_check=anywhere) is None
    assert "dtype float32" in why_not_swappable(nn.Linear(64, 32), device_check=anywhere)
    assert why_not_swappable(nn.Linear(64, 32, dtype=torch.float16), device_check=anywhere) is None  # FP16 out
    assert why_not_swappable(bf16_linear(12, 32), device_check=anywhere) == "K = 12 is not a multiple of 8"
    strided = bf16_linear(64, 32)
    strided.weight = nn.Parameter(torch.randn(64, 32, dtype=torch.bfloat16).t(), requires_grad=False)
    assert "unit stride" in why_not_swappable(strided, device_check=anywhere)
    mixed = bf16_linear(64, 32, bias=True)
    mixed.bias = nn.Parameter(torch.zeros(32))
    assert "bias is float32" in why_not_swappable(mixed, device_check=anywhere)
    attention = nn.MultiheadAttention(64, 4, dtype=torch.bfloat16)
    assert "subclass of nn.Linear" in why_not_swappable(attention.out_proj, device_check=anywhere)
    assert "not an nn.Linear" in why_not_swappable(nn.ReLU())

    def not_hopper(weight):
        raise ValueError("device cuda:0 has compute capability 8.0")

    assert "8.0" in why_not_swappable(bf16_linear(64, 32), device_check=not_hopper)


def test_swaps_in_nested_parents_and_reports_the_rest():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(4, 1, 64, dtype=torch.bfloat16)
    expected = model(x)
    report = swap_linears(model, batches=(1, 4), skip=["blocks.1.1"], factory=Stub.from_linear,
                          device_check=anywhere, programmatic_launch=False)
    assert sorted(report.swapped) == ["blocks.0.0.expand", "blocks.0.0.q", "blocks.0.1", "blocks.1.0.expand",
                                      "blocks.1.0.q", "head"]
    assert report.left_alone == {"blocks.1.1": "skipped by the caller (blocks.1.1)",
                                 "odd": "K = 12 is not a multiple of 8",
                                 "full": "dtype float32 (the kernel takes bfloat16 or float16 weights)"}
    assert report.aliases == {"head": ("tied",)}
    # Replaced where they sit: in a ModuleList of Sequentials, nested modules, and under both names.
    assert isinstance(model.blocks[0][0].q, Stub) and isinstance(model.blocks[0][1], Stub)
    assert type(model.blocks[1][1]) is nn.Linear
    assert model.head is model.tied and isinstance(model.head, Stub)
    assert all(stub.options == {"programmatic_launch": False} and stub.batches == (1, 4)
               for stub in report.swapped.values())
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    text = str(report)
    assert "6 of 9 nn.Linear layers" in text
    assert "blocks.*.*.q  x2" in text and "odd: K = 12 is not a multiple of 8" in text


def test_skip_by_glob_or_callable():
    report = swap_linears(Model(), skip="*expand", factory=Stub.from_linear, device_check=anywhere)
    assert report.left_alone["blocks.0.0.expand"] == "skipped by the caller (*expand)"
    report = swap_linears(Model(), skip=lambda name, module: "too small" if module.out_features < 64 else False,
                          factory=Stub.from_linear, device_check=anywhere)
    assert report.left_alone["head"] == "too small" and "blocks.0.0.q" in report.swapped


def test_fallbacks_found_at_run_time_go_back_to_nn_linear():
    torch.manual_seed(0)
    model = Model()
    originals = {name: model.get_submodule(name) for name in ("blocks.0.0.expand", "blocks.1.0.expand")}
    x = torch.randn(4, 1, 64, dtype=torch.bfloat16)
    expected = model(x)
    report = swap_linears(model, batches=(1, 4), factory=Stub.from_linear, device_check=anywhere)
    with report.record_rows():
        model(x)
    model(x)  # outside record_rows: rows are not counted again
    assert report.rows["blocks.0.0.expand"] == Counter({40: 1}) and report.rows["head"] == Counter({4: 2})
    found = report.fallbacks(model)
    assert sorted(found) == list(originals)
    assert found["blocks.0.0.expand"] == ("2 calls to F.linear: batch without a tactic (2); "
                                          "rows per call 40 vs prepared batches 1, 4")
    restored = report.restore_fallbacks(model)
    assert restored == found
    for name, original in originals.items():
        assert model.get_submodule(name) is original and name not in report.swapped
        assert report.left_alone[name].startswith("not a decode projection here: 2 calls")
    assert report.fallbacks(model) == {}
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_restore_follows_the_swapped_layers_weight_and_every_alias():
    model = Model()
    report = swap_linears(model, factory=Stub.from_linear, device_check=anywhere)
    replacement = nn.Parameter(torch.ones(48, 64, dtype=torch.bfloat16), requires_grad=False)
    report.swapped["head"].weight = replacement
    report.restore(model, ["head"], reason="by hand")
    assert type(model.head) is nn.Linear and model.tied is model.head and model.head.weight is replacement
    assert report.left_alone["head"] == "by hand"


def test_a_layer_that_does_not_prepare_is_left_as_it_was():
    # The real factory on the CPU: ProjectionLinear prepares nothing there, so the nn.Linear stays.
    model = nn.Sequential(bf16_linear(64, 32))
    report = swap_linears(model, device_check=anywhere)
    assert not report.swapped and type(model[0]) is nn.Linear
    assert report.left_alone["0"].startswith("not prepared")
    # On the CPU, by default, nothing is eligible and the report says why.
    report = swap_linears(Model())
    assert not report.swapped and set(report.left_alone.values()) == {"weight on cpu"}


def test_the_model_itself_and_existing_projection_layers():
    report = swap_linears(bf16_linear(64, 32), factory=Stub.from_linear, device_check=anywhere)
    assert report.left_alone[""].startswith("the model itself")
    model = nn.Sequential(ProjectionLinear(torch.randn(32, 64, dtype=torch.bfloat16)), bf16_linear(32, 16))
    report = swap_linears(model, factory=Stub.from_linear, device_check=anywhere)
    assert list(report.swapped) == ["1"] and isinstance(model[0], ProjectionLinear)


def test_replace_module_by_dotted_name():
    model = Model()
    new = nn.Identity()
    replace_module(model, "blocks.1.0.q", new)
    assert model.blocks[1][0].q is new
    assert isinstance(SwapReport(batches=(1,)).summary(), str)


# A tiny DeepseekV3 of transformers, through the example's own CPU path.


def load_example():
    spec = importlib.util.spec_from_file_location("deepseek_decode_step", EXAMPLES / "deepseek_decode_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_deepseek_v3_swap_finds_kv_b_proj():
    transformers = pytest.importorskip("transformers")
    example = load_example()
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"the example drives transformers >= 5, found {transformers.__version__}")
    result = example.main(["--tiny", "--device", "cpu", "--batches", "1", "4", "--cache-lens", "32"])
    report = result["report"]
    layers = example.TINY["num_hidden_layers"]
    # kv_b_proj expands the whole cache (batch x cache rows): found at run time and handed back to nn.Linear.
    expected = {f"model.layers.{i}.self_attn.kv_b_proj" for i in range(layers)}
    assert set(result["fallbacks"]) == expected == set(report.left_alone)
    assert all("rows per call 32" in report.left_alone[name] for name in expected)
    assert len(report.swapped) == 7 * layers + 1 and "lm_head" in report.swapped
    assert result["logits"].shape == (1, 1, example.TINY["vocab_size"])


def test_tiny_deepseek_v3_logits_unchanged_by_the_swap():
    transformers = pytest.importorskip("transformers")
    example = load_example()
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"the example drives transformers >= 5, found {transformers.__version__}")
    config = example.build_config(transformers, example.TINY, 32)
    model = example.build_model(transformers, config, "cpu", torch.bfloat16)
    ids = torch.randint(0, config.vocab_size, (4, 1))

    def step():
        cache = example.DecodeCache(transformers, config, 32, 4, "cpu", torch.bfloat16)
        cache.fill(lambda: model(input_ids=ids, past_key_values=cache.cache, use_cache=True))
        return model(input_ids=ids, past_key_values=cache.cache, use_cache=True).logits

    with torch.no_grad():
        expected = step()
        report = swap_linears(model, (1, 4), factory=Stub.from_linear, device_check=anywhere)
        swapped = step()
    assert all(isinstance(model.get_submodule(name), Stub) for name in report.swapped)
    torch.testing.assert_close(swapped, expected, rtol=0, atol=0)


def test_benchmark_plumbing_with_fake_graphs(monkeypatch, tmp_path, capsys):
    """The GPU branch of the example on the CPU: stand-in layers, graphs that run the step, made-up times."""
    import functools
    import json
    import types

    transformers = pytest.importorskip("transformers")
    example = load_example()
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"the example drives transformers >= 5, found {transformers.__version__}")
    monkeypatch.setattr(example, "swap_linears",
                        functools.partial(swap_linears, factory=Stub.from_linear, device_check=anywhere))
    monkeypatch.setattr(example, "projection_variants", lambda report, linears, batches, pdl: {
        "ours, PDL": dict(report.swapped),
        "ours, no PDL": {name: Stub.from_linear(linears[name], batches=batches) for name in report.swapped}})
    captured = []

    class Graph:
        def __init__(self, step, model):
            self.layer = model.get_submodule("lm_head")
            captured.append(self.layer)
            self.step = step

        def replay(self):
            self.step()

    def capture(step, reset):
        reset()
        return Graph(step, model_holder[0])

    model_holder = []
    build_model = example.build_model
    monkeypatch.setattr(example, "build_model", lambda *a: model_holder.append(build_model(*a)) or model_holder[0])
    monkeypatch.setattr(example, "capture", capture)
    monkeypatch.setattr(example, "time_graphs", lambda graphs, reset, replays: {
        name: 100.0 - 10 * index for index, name in enumerate(graphs)})
    monkeypatch.setattr(example, "profile_graph", lambda graph, reset: Counter(
        {"other GEMM": 5.0, "other": 3.0} if isinstance(graph.layer, nn.Linear) else
        {"decode_projection": 4.0, "other GEMM": 1.0, "other": 3.0}))
    monkeypatch.setattr(example, "glue_modules", functools.partial(example.glue_modules, factory=Stacked))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    out = tmp_path / "step.json"
    args = types.SimpleNamespace(replays=3, pdl="both", glue=True, no_profile=False, json=str(out))
    results = example.benchmark(transformers, args, dict(example.TINY), (1, 4), (32,), device="cpu")
    # Each cell captured nn.Linear, then the variants of this package's layers, in the model.
    assert [type(layer).__name__ for layer in captured] == ["Linear", "Stub", "Stub", "Stub"] * 2
    assert [cell["fallbacks"] for cell in results] == [0, 0]
    assert results[0]["speedup"] == {"ours, PDL": 100.0 / 90.0, "ours, no PDL": 100.0 / 80.0,
                                     "ours, PDL + glue": 100.0 / 70.0}
    text = capsys.readouterr().out
    assert "left alone   model.layers.*.self_attn.kv_b_proj  x2: not a decode projection here" in text
    assert "glue: 9 RMSNorms by ops.rms_norm; 2 MLPs as one gate+up projection" in text
    # nn.Linear's projections: its GEMMs less the other GEMMs of the swapped step.
    rows = [line.split() for line in text.splitlines() if line.split()[:3] == ["32", "1", "nn.Linear"]]
    assert rows[-1][3:7] == ["100.0", "4.0", "4.0%", "1.0"]  # the profile's row: step, projections, share, GEMMs
    saved = json.loads(out.read_text())
    assert saved["left_alone"].keys() == {f"model.layers.{i}.self_attn.kv_b_proj" for i in range(2)}


def test_glue_modules_on_the_tiny_model_keep_its_logits():
    transformers = pytest.importorskip("transformers")
    ops = pytest.importorskip("decode_projection.ops")
    example = load_example()
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"the example drives transformers >= 5, found {transformers.__version__}")
    config = example.build_config(transformers, example.TINY, 32)
    model = example.build_model(transformers, config, "cpu", torch.bfloat16)
    ids = torch.randint(0, config.vocab_size, (4, 1))

    def step():
        cache = example.DecodeCache(transformers, config, 32, 4, "cpu", torch.bfloat16)
        cache.fill(lambda: model(input_ids=ids, past_key_values=cache.cache, use_cache=True))
        return model(input_ids=ids, past_key_values=cache.cache, use_cache=True).logits

    glue, notes = example.glue_modules(model, ops, (1, 4), factory=Stacked)
    layers = example.TINY["num_hidden_layers"]
    assert len(glue) == 5 * layers + 1 and "model.norm" in glue and "model.layers.0.mlp" in glue
    with torch.no_grad():
        expected = step()
        with example.layers_of(model, glue):
            assert isinstance(model.model.layers[1].self_attn.kv_a_layernorm, example.GlueRMSNorm)
            glued = step()
    assert type(model.model.layers[0].mlp).__name__ == "DeepseekV3MLP"  # put back
    # One rounding in the glue's norm where transformers' rounds twice: close, not bitwise.
    torch.testing.assert_close(glued, expected, rtol=0.05, atol=0.05)


