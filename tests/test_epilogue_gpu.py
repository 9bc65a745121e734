"""GPU tests of the epilogues: bias and residual summed in FP32 before the one rounding on every store path, and
silu(gate) * up of gated projections."""

import pytest
import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.measure.checks import GatedReference, assert_close_to_reference
from decode_projection.projection import interleave_gate_up

from .tactic_grid import EPILOGUE_CASES, EPILOGUE_PATHS, GATED_PATHS, tactic_id

pytestmark = pytest.mark.gpu

def epilogue_id(case):
    weight, out, bias, residual = case
    return f"{str(weight)[6:]}-{str(out)[6:]}-bias_{str(bias)[6:] if bias else 'none'}-residual_{residual}"


def run_epilogue(projection, x, n, out_dtype, residual_kind, values=None, *, first_column=8, spare_columns=24):
    """Run into a slice of a NaN-poisoned buffer: in place, the slice first holds the residual ``values`` (fresh
    random ones where None); apart, the residual is a slice of a buffer with another row pitch. Returns
    ``(out, values)``; the guard must stay NaN and a residual apart untouched."""
    batch = x.shape[0]
    buffer = torch.full((batch + 2, n + spare_columns), float("nan"), dtype=out_dtype, device=x.device)
    out = buffer[1 : batch + 1, first_column : first_column + n]
    residual = None
    if residual_kind != "none":
        values = torch.randn(batch, n, device=x.device).to(out_dtype) if values is None else values
        if residual_kind == "in place":
            residual = out.copy_(values)
        else:
            holder = torch.full((batch, n + 40), float("nan"), dtype=out_dtype, device=x.device)
            residual = holder[:, 16 : 16 + n].copy_(values)
    projection.run(x, out, residual=residual)
    torch.cuda.synchronize()
    guard = buffer.clone()
    guard[1 : batch + 1, first_column : first_column + n] = float("nan")
    assert torch.isnan(guard).all(), "the kernel wrote outside its output"
    if residual_kind == "apart":
        assert torch.equal(residual, values), "the kernel wrote into the residual"
    return out, values


@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=epilogue_id)
@pytest.mark.parametrize("tactic", EPILOGUE_PATHS, ids=tactic_id)
def test_every_store_path_adds_bias_and_residual_once(tactic, case):
    weight_dtype, out_dtype, bias_dtype, residual_kind = case
    rows, acts = tactic.weight_rows, tactic.activation_rows
    # The second case's output pitch (n + 21) and base (column 3) leave the staged path element stores.
    for n, k, batch, first_column, spare_columns in [(2 * rows + 40, 1000, max(1, acts - 3), 8, 24),
                                                     (rows + 8, 520, 2 * acts + 5, 3, 21)]:
        weight = torch.randn(n, k, device="cuda").to(weight_dtype)
        x = torch.randn(batch, k, device="cuda").to(weight_dtype)
        bias = None if bias_dtype is None else torch.randn(n, device="cuda").to(bias_dtype)
        projection = PreparedProjection(weight, {batch: tactic}, output_dtype=out_dtype, bias=bias,
                                        residual=residual_kind != "none").prepare()
        out, residual = run_epilogue(projection, x, n, out_dtype, residual_kind, first_column=first_column,
                                     spare_columns=spare_columns)
        addend = torch.zeros(1, n, device="cuda", dtype=torch.float64)
        if bias is not None:
            addend = addend + bias.double()[None, :]
        if residual is not None:
            addend = addend + residual.double()
        assert_close_to_reference(out, x, weight, addend=addend,
                                  label=f"{tactic} {epilogue_id(case)} N={n} K={k} M={batch}")
        # Bitwise repeatable: the same inputs give the same bits.
        again, _ = run_epilogue(projection, x, n, out_dtype, residual_kind, residual, first_column=first_column,
                                spare_columns=spare_columns)
        assert torch.equal(again, out), f"{tactic} {epilogue_id(case)}: not repeatable"


def test_batch_invariant_rows_with_bias_and_residual_do_not_depend_on_the_batch():
    n, k = 7168, 1536
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    batches = (1, 2, 8, 16, 64, 128, 256)
    projection = PreparedProjection.for_weight(weight, batches, batch_invariant=True, bias=bias, residual=True)
    x = torch.randn(max(batches), k, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(max(batches), n, device="cuda", dtype=torch.bfloat16)
    rows = {}
    for batch in batches:
        out = residual[:batch].clone()
        projection.run(x[:batch], out, residual=out)
        rows[batch] = out
    torch.cuda.synchronize()
    assert_close_to_reference(rows[256], x, weight, addend=bias.double()[None, :] + residual.double(),
                              label="batch-invariant with bias and residual, M=256")
    for batch in batches:
        assert torch.equal(rows[batch], rows[256][:batch]), f"batch {batch} rows differ from batch 256's"


def test_fp16_weights_write_fp16_outputs():
    weight = torch.randn(2112, 7168, device="cuda", dtype=torch.float16)
    x = torch.randn(8, 7168, device="cuda", dtype=torch.float16)
    projection = PreparedProjection.for_weight(weight, (8,), output_dtype=torch.float16)
    out = torch.full((8, 2112), float("nan"), device="cuda", dtype=torch.float16)
    projection.run(x, out)
    torch.cuda.synchronize()
    assert_close_to_reference(out, x, weight, label="fp16 -> fp16")


def test_the_epilogue_benchmark_times_every_provider():
    from decode_projection.measure.epilogue_bench import bench_epilogues, epilogue_table

    epilogues = ["residual", "bias", "silu-mul"]
    cells = bench_epilogues([(2048, 1536)], [1, 64], epilogues, contexts=["chain", "glue"])
    assert len(cells) == 2 * len(epilogues) * 2
    for cell in cells:
        assert 0 < cell.plain_us < 1000 and 0 < cell.fused_us < 1000 and 0 < cell.separate_us < 1000
        assert (cell.torch_us is None) == (cell.epilogue == "bias")
    assert "2048 x 1536, silu-mul (us)" in epilogue_table(cells)


def test_a_layer_with_bias_adds_it_in_the_kernel():
    from torch import nn

    from decode_projection.layer import ProjectionLinear

    for dtype in (torch.bfloat16, torch.float16):
        linear = nn.Linear(1536, 2304, device="cuda", dtype=dtype)
        layer = ProjectionLinear.from_linear(linear, batches=(4,))
        x = torch.randn(4, 1536, device="cuda", dtype=dtype)
        out = layer(x)
        assert out.dtype == dtype and not layer.fallbacks
        assert layer.prepared.bias is not None  # fused, not added after the kernel
        assert_close_to_reference(out, x, layer.weight, addend=layer.bias.double()[None, :], label=f"layer {dtype}")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tactic", GATED_PATHS, ids=tactic_id)
def test_every_gated_path_writes_silu_of_gate_times_up(tactic, out_dtype):
    rows, acts = tactic.weight_rows, tactic.activation_rows
    # N not a multiple of 8 (a padded last group), N past a tile; a batch under one tile, one over two.
    for n, k, batch in [(rows + 12, 1000, max(1, acts - 3)), (rows // 2 + 3, 520, 2 * acts + 5)]:
        gate, up = (torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(2))
        x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
        projection = PreparedProjection(interleave_gate_up(gate, up), {batch: tactic}, output_dtype=out_dtype,
                                        gated_rows=n).prepare()
        out, _ = run_epilogue(projection, x, n, out_dtype, "none")
        GatedReference(x, gate, up, out_dtype).check(out, f"gated {tactic} N={n} K={k} M={batch} {out_dtype}")
        again, _ = run_epilogue(projection, x, n, out_dtype, "none")
        assert torch.equal(again, out), f"gated {tactic}: not repeatable"


@pytest.mark.parametrize("n", [1536, 4224])  # the shared expert's and the dense MLP's gate/up halves
def test_gated_kimi_pairs_with_the_tables_tactics(n):
    k, batches = 7168, (1, 8, 64, 256)
    gate, up = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.25 for _ in range(2))
    projection = PreparedProjection.gated(gate, up, batches)
    for batch in batches:
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        out, _ = run_epilogue(projection, x, n, torch.bfloat16, "none")
        GatedReference(x, gate, up, torch.bfloat16).check(out, f"gated {n}x{k} M={batch} "
                                                               f"{projection.policies[batch]}")


def test_a_gated_layer_runs_the_kernel_compiled_and_captured():
    from torch import nn

    from decode_projection.layer import ProjectionLinear

    gate, up = (nn.Linear(1536, 1000, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    layer = ProjectionLinear.gated(gate, up, batches=(1, 8))
    x = torch.randn(8, 1536, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = layer(x)
        assert eager.shape == (8, 1000) and not layer.fallbacks
        GatedReference(x, gate.weight, up.weight, torch.bfloat16).check(eager, "gated layer")
        assert torch.equal(torch.compile(layer, fullgraph=True)(x), eager)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager) and not layer.fallbacks


@pytest.mark.parametrize("tactic", [SplitKTactic(64, 8, 1, 6, k_boxes=4), SplitKTactic(128, 64, 1, 6),
                                    SplitKTactic(16, 8, 1, 4, k_boxes=4, fold=4), SplitKTactic(64, 64, 4, 4)],
                         ids=tactic_id)
def test_the_residual_and_bias_are_read_after_the_kernel_before_wrote_them(tactic):
    """A PDL-aware kernel writes the residual and the bias just before the projection (which streams its first weight
    stages before it waits): read before its wait, they would still hold the NaN they held before."""
    from decode_projection.measure.glue import pdl_glue

    n, k, batch = 2 * tactic.weight_rows + 40, 1000, tactic.activation_rows + 3
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    residual = torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bias_values, residual_values = torch.randn_like(bias), torch.randn_like(residual)
    projection = PreparedProjection(weight, {batch: tactic}, bias=bias, residual=True).prepare()
    out = torch.full_like(residual, float("nan"))
    torch.cuda.synchronize()
    pdl_glue(bias_values.view(1, n), bias.view(1, n))()
    pdl_glue(residual_values, residual)()
    projection.run(x, out, residual=residual)
    torch.cuda.synchronize()
    assert_close_to_reference(out, x, weight, addend=bias_values.double()[None, :] + residual_values.double(),
                              label=f"{tactic} after a PDL-aware writer of its residual and bias")
