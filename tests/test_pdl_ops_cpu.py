"""CPU tests of the decode glue ops (norm.py, activation.py, ops.py): every kernel variant compiles for sm_90a
with its PDL instructions where they belong, every argument the kernels cannot take is refused by name, valid
ones reach the launch as the addresses, extents and pitches the kernels take, and the custom ops trace and check
anywhere."""

import re
import types

from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from decode_projection import ops
from decode_projection.kernel import activation, norm, rowwise
from decode_projection.measure.ops_reference import (
    GlueReference,
    rms_norm_float64,
    silu_and_mul_float64,
    torch_manual_rms_norm,
    torch_silu_and_mul,
)
from decode_projection.runtime.sass import kernel_report

BF16 = torch.bfloat16


def kernels():
    """(label, compiled) of every code variant."""
    for dtype in (torch.bfloat16, torch.float16):
        for fused in (False, True):
            yield f"rms_norm {dtype} fused={fused}", lambda d=dtype, f=fused: norm.compile_rms_norm(d, f, "sm_90a")
        yield f"silu_and_mul {dtype}", lambda d=dtype: activation.compile_silu_and_mul(d, "sm_90a")
    yield "rms_norm plain launch", lambda: norm.compile_rms_norm(BF16, True, "sm_90a", False)
    yield "silu_and_mul plain launch", lambda: activation.compile_silu_and_mul(BF16, "sm_90a", False)


def opcodes(sass):
    """The SASS opcodes of a kernel in program order, modifiers kept (LDG.E.128)."""
    return re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.MULTILINE)


@pytest.mark.parametrize("label, build", list(kernels()), ids=[label for label, _ in kernels()])
def test_kernel_compiles_with_pdl_before_any_load_and_16_byte_accesses(label, build):
    report = kernel_report(build())
    assert report.arch == "sm_90a" and report.local_bytes == 0, f"{label}: spills or wrong target"
    code = opcodes(report.sass)
    # griddepcontrol.launch_dependents is PREEXIT, griddepcontrol.wait is ACQBULK: the trigger first, then the wait,
    # then the first global load (every input may be the previous kernel's output).
    loads = [i for i, op in enumerate(code) if op.startswith("LDG")]
    assert code.count("PREEXIT") == 1 and code.count("ACQBULK") == 1, label
    assert code.index("PREEXIT") < code.index("ACQBULK") < loads[0], label
    # 16-byte vectors only: no narrower global access.
    assert {code[i] for i in loads} == {"LDG.E.128"}, label
    assert {op for op in code if op.startswith("STG")} == {"STG.E.128"}, label
    # No whole-warp shuffle or warp sync in divergent code: against the CTA barrier it deadlocks.
    assert "BRA.DIV" not in report.sass and "WARPSYNC.COLLECTIVE" not in report.sass, label


def test_compiled_code_is_cached_per_variant():
    assert norm.compile_rms_norm(BF16, False, "sm_90a") is norm.compile_rms_norm(BF16, False, "sm_90a")
    assert norm.compile_rms_norm(BF16, False, "sm_90a") is not norm.compile_rms_norm(BF16, True, "sm_90a")
    assert activation.compile_silu_and_mul(BF16, "sm_90a") is activation.compile_silu_and_mul(BF16, "sm_90a")


STREAM = 0x1234  # the current stream's handle where a test fakes it


@pytest.fixture
def launches(monkeypatch):
    """Let validation run on CPU tensors as on a Hopper GPU, and record launches (op, code, kinds, values) instead
    of making them."""
    monkeypatch.setattr(rowwise, "architecture", lambda device: "sm_90a")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=STREAM))
    calls = []
    record = lambda op, code, device, kinds, values, dtype: calls.append((op, code, kinds, values))  # noqa: E731
    monkeypatch.setattr(norm, "launch", record)
    monkeypatch.setattr(activation, "launch", record)
    return calls


def rand(*shape, dtype=BF16):
    return torch.randn(*shape, dtype=dtype)


def test_valid_norm_arguments_reach_the_launch_as_pointers_and_pitches(launches):
    wide = rand(5, 80)
    x = wide[1:4, 8:72]  # a row and column slice: pitch 80, 16-byte aligned
    weight = rand(64)
    out = norm.rms_norm(x, weight, 1e-5)
    (op, code, kinds, values), = launches
    assert op == "rms_norm" and code is norm.compile_rms_norm(BF16, False, "sm_90a")
    assert kinds == norm.value_kinds(False)
    # Unfused, no residual: its pointers are None and its pitches 0.
    assert values == (x.data_ptr(), weight.data_ptr(), out.data_ptr(), None, None, 3, 64, 80, 64, 0, 0, 1e-5, STREAM)
    assert out.shape == (3, 64)
    # A single row: whatever stride PyTorch reports for it, its pitch is the row's width.
    norm.rms_norm(rand(64, 1).T, weight, 0)  # strides (1, 1)
    assert launches[-1][3].x_pitch == 64 and launches[-1][3].eps == 0.0 and isinstance(launches[-1][3].eps, float)


def test_fused_norm_arguments_reach_the_launch_as_pointers_and_pitches(launches):
    x, residual, weight = rand(4, 96)[:, :64], rand(4, 72)[:, 8:], rand(64)
    out, total = norm.fused_add_rms_norm(x, residual, weight, out=x)
    (op, code, kinds, values), = launches
    assert op == "fused_add_rms_norm" and code is norm.compile_rms_norm(BF16, True, "sm_90a")
    assert kinds == norm.value_kinds(True) and out is x
    assert values == (x.data_ptr(), weight.data_ptr(), x.data_ptr(), residual.data_ptr(), total.data_ptr(), 4, 64,
                      96, 96, 72, 64, 1e-6, STREAM)


def test_in_place_outputs_are_allowed_exactly(launches):
    x, residual, weight = rand(4, 64), rand(4, 64), rand(64)
    assert norm.rms_norm(x, weight, out=x) is x
    out, total = norm.fused_add_rms_norm(x, residual, weight, out=x, residual_out=residual)  # vLLM's in place
    assert out is x and total is residual
    norm.fused_add_rms_norm(x, residual, weight, out=residual, residual_out=x)
    assert len(launches) == 3
    assert launches[1][1] is norm.compile_rms_norm(BF16, True, "sm_90a")


def test_empty_batches_launch_nothing(launches):
    weight = rand(64)
    assert norm.rms_norm(rand(0, 64), weight).shape == (0, 64)
    out, total = norm.fused_add_rms_norm(rand(0, 64), rand(0, 64), weight)
    assert out.shape == total.shape == (0, 64)
    assert activation.silu_and_mul(rand(0, 64)).shape == (0, 32)
    assert not launches


def test_norm_rejects_bad_arguments(launches):
    x, weight = rand(4, 64), rand(64)
    wide = rand(4, 72)
    cases = [
        (("x", weight), {}, TypeError, "rms_norm input must be a torch.Tensor, got str"),
        ((x[None], weight), {}, ValueError, r"input must be 2-D \[rows, width\]"),
        ((x.float(), weight.float()), {}, ValueError, "input must be BF16 or FP16, got torch.float32"),
        ((rand(4, 12), rand(12)), {}, ValueError, "input width must be a multiple of 8"),
        ((wide[:, 4:68], weight), {}, ValueError, "16-byte aligned base and row pitch"),
        ((rand(4, 68)[:, :64], weight), {}, ValueError, "16-byte aligned base and row pitch"),
        ((rand(64, 4).T, weight), {}, ValueError, "input needs unit stride along its last dimension"),
        ((rand(1, 64).expand(4, 64), weight), {}, ValueError, "input rows overlap"),
        ((torch._neg_view(x), weight), {}, ValueError, "input is a negated view"),
        ((x, rand(72)), {}, ValueError, r"weight must be \(64,\) like the input's rows"),
        ((x, weight.half()), {}, ValueError, "weight dtype torch.float16 != input dtype torch.bfloat16"),
        ((x, weight[None]), {}, ValueError, r"weight must be 1-D \[width\]"),
        ((x, rand(72)[1:65]), {}, ValueError, "weight needs a 16-byte aligned base"),
        ((x, weight.to("meta")), {}, ValueError, "weight is on meta, the input on cpu"),
        ((x, weight, "1e-6"), {}, TypeError, "eps must be a float, got str"),
        ((x, weight, True), {}, TypeError, "eps must be a float, got bool"),
        ((x, weight, -1e-6), {}, ValueError, "eps must be finite and non-negative"),
        ((x, weight, float("nan")), {}, ValueError, "eps must be finite and non-negative"),
        ((rand(4, 0), rand(0)), {}, ValueError, "input rows are empty"),
        ((x, weight), {"programmatic_launch": 1}, TypeError, "programmatic_launch must be a bool, got 1"),
        ((x, weight), {"out": rand(4, 72)}, ValueError, r"output must be \(4, 64\) like the input"),
        ((x, weight), {"out": rand(4, 64).half()}, ValueError, "output dtype torch.float16 != input dtype"),
        ((x, weight), {"out": wide[:, 4:68]}, ValueError, "output needs a 16-byte aligned base"),
        ((x, weight), {"out": rand(4, 64).requires_grad_()}, ValueError, "output requires grad"),
        ((x[:3], weight), {"out": x[1:]}, ValueError, r"output overlaps its input \(it may only be exactly"),
        ((wide[:, :64], rand(64)), {"out": wide[:, 8:]}, ValueError, "output overlaps its input"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            norm.rms_norm(*args, **kwargs)
    weight_rows = rand(2, 64)
    with pytest.raises(ValueError, match="output overlaps its weight"):
        norm.rms_norm(rand(1, 64), weight_rows[0], out=weight_rows[:1])
    assert not launches
    # Column slices of one buffer that share no byte are fine.
    norm.rms_norm(wide[:, :64], rand(64), out=rand(4, 136)[:, 72:])
    assert len(launches) == 1


def test_fused_norm_rejects_bad_arguments(launches):
    x, residual, weight = rand(4, 64), rand(4, 64), rand(64)
    cases = [
        ((x, rand(3, 64), weight), {}, ValueError, r"residual must be \(4, 64\) like the input"),
        ((x, residual.half(), weight), {}, ValueError, "residual dtype torch.float16 != input dtype"),
        ((x, rand(4, 72)[:, 4:68], weight), {}, ValueError, "residual needs a 16-byte aligned base"),
        ((x, "r", weight), {}, TypeError, "residual must be a torch.Tensor"),
        ((x, residual, weight), {"residual_out": rand(4, 64).half()}, ValueError, "residual_out dtype"),
        ((x, residual, weight), {"out": x, "residual_out": x}, ValueError, "output overlaps its residual_out"),
        ((x, residual, weight), {"residual_out": weight[None]}, ValueError,
         r"residual_out must be \(4, 64\) like the input"),
        ((x[:3], residual[:3], weight), {"residual_out": residual[1:]}, ValueError,
         r"residual_out overlaps its residual \(it may only be exactly"),
        ((x[:3], residual[:3], weight), {"out": residual[1:]}, ValueError, "output overlaps its residual"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            norm.fused_add_rms_norm(*args, **kwargs)
    assert not launches


def test_silu_and_mul_rejects_bad_arguments(launches):
    x = rand(4, 64)
    cases = [
        ((3,), {}, TypeError, "silu_and_mul input must be a torch.Tensor"),
        ((rand(4, 24),), {}, ValueError, r"must be \[M, 2N\] with N a positive multiple of 8, got \(4, 24\)"),
        ((rand(4, 0),), {}, ValueError, "N a positive multiple of 8"),
        ((x.float(),), {}, ValueError, "must be BF16 or FP16"),
        ((rand(4, 72)[:, 4:68],), {}, ValueError, "input needs a 16-byte aligned base"),
        ((x,), {"out": rand(4, 64)}, ValueError, r"output must be \(4, 32\) for input \(4, 64\)"),
        ((x,), {"out": rand(4, 32).half()}, ValueError, "output dtype torch.float16"),
        ((x,), {"out": x[:, :32]}, ValueError, "output overlaps its input"),
        ((x,), {"out": rand(64, 4).T[:, :32]}, ValueError, "output must be|output needs unit stride"),
        ((x,), {"programmatic_launch": None}, TypeError, "programmatic_launch must be a bool"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            activation.silu_and_mul(*args, **kwargs)
    assert not launches
    out = activation.silu_and_mul(x)
    (op, code, kinds, values), = launches
    assert op == "silu_and_mul" and code is activation.compile_silu_and_mul(BF16, "sm_90a")
    # The gate and up halves: both (4, 32) with the input's pitch, the up half 64 bytes in.
    assert kinds == activation.VALUE_KINDS
    assert values == (x.data_ptr(), x.data_ptr() + 64, out.data_ptr(), 4, 32, 64, 32, STREAM)


def test_inputs_off_a_hopper_gpu_are_refused():
    with pytest.raises(ValueError, match="rms_norm input: decode_projection runs on CUDA devices"):
        norm.rms_norm(rand(4, 64), rand(64))
    with pytest.raises(ValueError, match="silu_and_mul input: decode_projection runs on CUDA devices"):
        activation.silu_and_mul(rand(4, 64))


def test_custom_ops_pass_opcheck():
    """Schemas, fake implementations against the real (CPU) ones, and dispatch."""
    for dtype in (BF16, torch.float32):
        x, residual, weight = rand(2, 3, 64, dtype=dtype), rand(2, 3, 64, dtype=dtype), rand(64, dtype=dtype)
        torch.library.opcheck(torch.ops.decode_projection.rms_norm, (x, weight, 1e-6))
        torch.library.opcheck(torch.ops.decode_projection.fused_add_rms_norm, (x, residual, weight, 1e-5))
        torch.library.opcheck(torch.ops.decode_projection.silu_and_mul, (x,))


def test_fake_implementations_give_the_output_shapes():
    with FakeTensorMode():
        x, weight = torch.empty(2, 3, 7168, dtype=BF16), torch.empty(7168, dtype=BF16)
        assert ops.rms_norm(x, weight).shape == (2, 3, 7168)
        y, total = ops.fused_add_rms_norm(x, x, weight)
        assert y.shape == total.shape == (2, 3, 7168) and y.dtype == BF16
        assert ops.silu_and_mul(x).shape == (2, 3, 3584)


def block(h, residual, norm_weight, gate_up, down, eps=1e-6):
    """A decoder-block shaped chain of the three ops (projections as plain matmuls)."""
    y, residual = ops.fused_add_rms_norm(h, residual, norm_weight, eps)
    h = ops.silu_and_mul(y @ gate_up.T) @ down.T
    return ops.rms_norm(h, norm_weight, eps), residual


def test_torch_compile_fullgraph_traces_the_ops():
    torch._dynamo.reset()
    h, residual, weight = rand(4, 64), rand(4, 64), rand(64)
    gate_up, down = rand(96, 64) / 8, rand(64, 48) / 8
    eager = block(h, residual, weight, gate_up, down)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(h, residual, weight, gate_up, down)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_cpu_implementations_round_once():
    """The CPU reference: every element within one ulp of float64 (a faithful rounding)."""
    x, residual, weight = rand(8, 512), rand(8, 512), rand(512)
    GlueReference(rms_norm_float64(x, weight, 1e-6), torch_manual_rms_norm(x, weight, 1e-6)).check(
        ops.rms_norm(x, weight), "rms_norm on the CPU")
    y, total = ops.fused_add_rms_norm(x, residual, weight)
    assert torch.equal(total, x + residual)
    GlueReference(rms_norm_float64(total, weight, 1e-6), torch_manual_rms_norm(total, weight, 1e-6)).check(
        y, "fused_add_rms_norm on the CPU")
    GlueReference(silu_and_mul_float64(x), torch_silu_and_mul(x)).check(ops.silu_and_mul(x), "silu_and_mul on the CPU")


def test_reference_judge_catches_a_wrong_element_and_names_it():
    x, weight = rand(8, 512), rand(512)
    reference = GlueReference(rms_norm_float64(x, weight, 1e-6), torch_manual_rms_norm(x, weight, 1e-6))
    y = ops.rms_norm(x, weight)
    y[5, 300] = reference.value[5, 300] * (1 + 2**-5)  # 4-8 ulps off: the Frobenius bound alone would not see it
    with pytest.raises(AssertionError, match=r"at \[5, 300\]"):
        reference.check(y, "one wrong element")
    y[5, 300] = float("nan")
    with pytest.raises(AssertionError, match=r"inf ulp .* at \[5, 300\]"):
        reference.check(y, "one NaN")


def test_op_wrappers_validate_eps_and_shapes():
    x, weight = rand(4, 64), rand(64)
    with pytest.raises(TypeError, match="rms_norm eps must be a float, got str"):
        ops.rms_norm(x, weight, "1e-6")
    with pytest.raises(ValueError, match="fused_add_rms_norm eps must be finite"):
        ops.fused_add_rms_norm(x, x, weight, -1.0)


def test_kernel_rows_are_views_when_aligned_and_copies_otherwise():
    wide = rand(2, 3, 80)
    aligned = wide[..., 8:72]
    rows = ops._kernel_rows("op", aligned)
    assert rows.shape == (6, 64) and rows.data_ptr() == aligned.data_ptr() and rows.stride() == (80, 1)
    shifted = wide[..., 4:68]
    copied = ops._kernel_rows("op", shifted)
    assert copied.data_ptr() != shifted.data_ptr() and copied.is_contiguous()
    assert torch.equal(copied, shifted.reshape(6, 64))
    with pytest.raises(ValueError, match="op input must have a last dimension"):
        ops._kernel_rows("op", torch.tensor(1.0))


def test_compile_functions_refuse_what_they_cannot_build():
    with pytest.raises(ValueError, match="rms_norm takes torch.bfloat16 or torch.float16, got torch.float32"):
        norm.compile_rms_norm(torch.float32, False, "sm_90a")
    with pytest.raises(TypeError, match="silu_and_mul programmatic_launch must be a bool"):
        activation.compile_silu_and_mul(BF16, "sm_90a", "yes")


def test_benchmark_script_pairs_each_op_with_a_projection_it_feeds():
    from .test_scripts_cpu import load_script

    script = load_script("glue_ops", Path(__file__).parents[1] / "benchmarks")
    assert script.follows("rms_norm", 7168) and script.follows("silu_and_mul", 4224)
    assert not script.follows("rms_norm", 1536)
    for op, (n, k) in script.FOLLOWING.items():
        assert k in (script.SILU_WIDTHS if op == "silu_and_mul" else script.NORM_WIDTHS), op
