"""RMSNorm, optionally after a residual add: PDL-aware decode glue between projections (sm_90a, CuTe DSL).

For each row ``m`` of ``x [M, H]`` (BF16 or FP16) and a ``weight [H]`` of the same dtype::

    rms_norm:            y[m, h] = x[m, h] / sqrt(mean_h(x[m, h]^2) + eps) * weight[h]
    fused_add_rms_norm:  s = x + residual;   y = rms_norm(s)

All arithmetic is FP32 and every output is rounded once: ``s`` to the input dtype (it is written out, as the
residual stream the next block adds to), ``y`` after the weight multiply. The norm is taken of the rounded ``s``,
so the fused ``y`` is bitwise ``rms_norm(s)`` of the ``s`` it wrote. (vLLM's kernel and the formula models write
out round ``x * rstd`` before multiplying by the weight: two roundings.)

One CTA per row. Each thread takes the row's 16-byte vectors ``thread, thread + T, ...``; the first pass sums
their squares (and, fused, adds the residual and writes ``s``), the second scales them and writes ``y``. The sum
has one fixed order: each thread's vectors in turn, the lanes of a warp by butterfly shuffles, the warps in
index order through shared memory. A row's result thus depends on its own values and ``H`` only: bitwise
repeatable, and the same whatever the batch. A thread reads and writes only its own elements, in both passes,
so ``out`` may be ``x`` itself and ``residual_out`` may be ``residual`` (vLLM's in-place
``fused_add_rms_norm``) or ``x``.

Programmatic dependent launch: the kernel triggers its dependents as it starts and waits on its predecessor
before reading anything (see ``RMSNorm.kernel``).

The compiled entry point (``RMSNorm.__call__``) takes the operands as pointers with the rows, the width and each
operand's row pitch (``NormValues``), which ``rowwise.launch`` writes into call slots (docs/host-cost.md).
"""

import ctypes
from functools import cache
from math import isfinite
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream
from torch.autograd.graph import increment_version

try:
    from cutlass.memory import SmemAllocator
except ImportError:  # the CuTe DSL 4.7 has it in cutlass.utils only (where 4.8 deprecates it)
    from cutlass.utils import SmemAllocator

from ..runtime import compile_lock, current_stream_handle, row_pitch
from .rowwise import (
    VECTOR,
    check_dtype,
    check_launch_flag,
    check_no_overlap,
    check_rows_alignment,
    check_tensor,
    check_writable,
    dsl_arguments,
    launch,
    placeholder_values,
    rows_tensor,
    vector_tensor,
    vectors,
)

THREADS = 128  # per CTA (one row): 7 vectors a thread at H = 7168
UNROLL = 4  # each pass unrolled 4 times: up to 4 of a thread's 16-byte loads in flight


class NormValues(NamedTuple):
    """``RMSNorm.__call__``'s arguments, in its order, as a launch passes them: the addresses of x, the weight, out,
    the residual and residual_out (None unfused), the rows, the width, the four row pitches in elements (0 for the
    residual's and residual_out's unfused), eps and the stream's handle."""

    x: object
    weight: object
    out: object
    residual: object
    residual_out: object
    rows: object
    width: object
    x_pitch: object
    out_pitch: object
    residual_pitch: object
    residual_out_pitch: object
    eps: object
    stream: object


# The C type the compiled function takes each value as (runtime/call_slots.py), fused.
FUSED_VALUE_KINDS = NormValues(*[ctypes.c_void_p] * 5, ctypes.c_int32, ctypes.c_int32, *[ctypes.c_int64] * 4,
                               ctypes.c_float, ctypes.c_void_p)


def value_kinds(fused_residual) -> NormValues:
    """The C type of each ``NormValues`` the kernel of ``fused_residual`` takes (None for the residual pointers it
    lacks)."""
    return FUSED_VALUE_KINDS if fused_residual else FUSED_VALUE_KINDS._replace(residual=None, residual_out=None)


class RMSNorm:
    """y (M, H) = rms_norm(x (M, H)) * weight (H), or with ``fused_residual`` of s = x + residual, written too.

    Contracts (checked on the host): rows with unit stride, 16-byte aligned bases and row pitches, H % 8 == 0;
    one dtype (BF16 or FP16) for every operand; ``out`` and ``residual_out`` overlap nothing they read but
    possibly an input they replace element for element (module docstring).
    """

    def __init__(self, fused_residual: bool, programmatic_launch: bool = True, threads: int = THREADS):
        if threads % 32 or not 32 <= threads <= 1024:
            raise ValueError(f"RMSNorm threads must be a multiple of 32 in 32..1024, got {threads}")
        self.fused_residual = fused_residual
        # The launch attribute only: without it the kernel's griddepcontrol instructions do nothing.
        self.programmatic_launch = programmatic_launch
        self.threads = threads

    @cute.jit
    def __call__(
        self,
        x: cute.Pointer,
        weight: cute.Pointer,
        out: cute.Pointer,
        residual: Optional[cute.Pointer],
        residual_out: Optional[cute.Pointer],
        rows: cutlass.Int32,
        width: cutlass.Int32,
        x_pitch: cutlass.Int64,
        out_pitch: cutlass.Int64,
        residual_pitch: cutlass.Int64,
        residual_out_pitch: cutlass.Int64,
        eps: cutlass.Float32,
        stream,
    ):
        """Build the operands' tensors and launch one CTA per row on ``stream`` (``residual`` and ``residual_out``
        None unless fused)."""
        x_rows = rows_tensor(x, rows, width, x_pitch)
        # Unfused, the residual operands are placeholders the kernel never touches.
        residual_rows = residual_out_rows = x_rows
        if cutlass.const_expr(self.fused_residual):
            residual_rows = rows_tensor(residual, rows, width, residual_pitch)
            residual_out_rows = rows_tensor(residual_out, rows, width, residual_out_pitch)
        out_rows = rows_tensor(out, rows, width, out_pitch)
        self.kernel(x_rows, vector_tensor(weight, width), out_rows, residual_rows, residual_out_rows, eps).launch(
            grid=(rows, 1, 1),
            block=(self.threads, 1, 1),
            stream=stream,
            use_pdl=self.programmatic_launch,
        )

    @cute.kernel
    def kernel(
        self,
        x: cute.Tensor,
        weight: cute.Tensor,
        out: cute.Tensor,
        residual: cute.Tensor,
        residual_out: cute.Tensor,
        eps: cutlass.Float32,
    ):
        """One row: sum its squares (fused: of x + residual, written out), then write it scaled by rstd * weight."""
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        # Triggering at the very start is safe: a dependent (our projection, another glue op) reads what this grid
        # writes only after its own griddepcontrol.wait, which returns once this whole grid has completed and its
        # writes are flushed. The trigger only lets the dependent's CTAs be scheduled (and stream their weights)
        # early; and it fires once every CTA of this grid has executed it, i.e. once all of them are resident, so
        # the dependent can never crowd them out.
        cute.arch.griddepcontrol_launch_dependents()
        # Every input may be the previous kernel's output (the weight too, kept simple): nothing is read before.
        cute.arch.griddepcontrol_wait()

        width = x.shape[1]
        count = width // VECTOR
        x_row, out_row = vectors(x, row), vectors(out, row)
        weight_vectors = cute.logical_divide(weight, cute.make_layout(VECTOR))
        normed = x_row  # the rows the norm is taken of: x, or fused the rounded sum as written
        if cutlass.const_expr(self.fused_residual):
            residual_row = vectors(residual, row)
            normed = vectors(residual_out, row)
        squares = cutlass.Float32(0.0)
        for i in cutlass.range(tidx, count, self.threads, unroll=UNROLL):
            value = x_row[None, i].load().to(cutlass.Float32)
            if cutlass.const_expr(self.fused_residual):
                total = (value + residual_row[None, i].load().to(cutlass.Float32)).to(x.element_type)
                normed[None, i].store(total)
                value = total.to(cutlass.Float32)
            for e in cutlass.range_constexpr(VECTOR):
                squares = squares + value[e] * value[e]
        rstd = cute.math.rsqrt(self.row_sum(squares) / cutlass.Float32(width) + eps)
        # Fused, each thread reads back only the sums it wrote itself, which program order makes visible to it.
        for i in cutlass.range(tidx, count, self.threads, unroll=UNROLL):
            value = normed[None, i].load().to(cutlass.Float32)
            scale = weight_vectors[None, i].load().to(cutlass.Float32)
            out_row[None, i].store((value * rstd * scale).to(out.element_type))

    @cute.jit
    def row_sum(self, value: cutlass.Float32) -> cutlass.Float32:
        """The CTA's sum of one value per thread, in a fixed order, in every thread."""
        warps = self.threads // 32
        # Butterfly: at each step both lanes of a pair add the same two values, so every lane ends with the same sum.
        value = cute.arch.warp_reduction_sum(value)
        partials = SmemAllocator().allocate_tensor(cutlass.Float32, cute.make_layout(warps), byte_alignment=16)
        # warp_idx() is a shfl.sync over the whole warp: every lane must run it, so outside the lane-0 branch
        # (inside it, lane 0 waits for lanes parked at the barrier below: a deadlock).
        warp = cute.arch.warp_idx()
        if cute.arch.lane_idx() == 0:
            partials[warp] = value
        cute.arch.barrier()
        total = partials[0]
        for w in cutlass.range_constexpr(1, warps):
            total = total + partials[w]
        return total


def compile_rms_norm(dtype, fused_residual, arch, programmatic_launch=True):
    """The norm kernel for one dtype and variant, compiled once (symbolic batch, width, pitches and pointers)."""
    check_dtype("rms_norm", dtype)
    check_launch_flag("rms_norm", programmatic_launch)
    return _compile(dtype, bool(fused_residual), arch, programmatic_launch)


@cache
def _compile(dtype, fused_residual, arch, programmatic_launch):
    """compile_rms_norm on normalized arguments (one entry however they were passed)."""
    kinds = value_kinds(fused_residual)
    args = dsl_arguments(kinds, placeholder_values(kinds), dtype, make_fake_stream())
    with compile_lock:  # cute.compile is not thread-safe
        return cute.compile(RMSNorm(fused_residual, programmatic_launch), *args, options=f"--gpu-arch={arch}")


def launch_values(x, weight, out, residual, residual_out, eps) -> NormValues:
    """One launch's ``NormValues``: checked torch tensors (``residual`` and ``residual_out`` None unfused), on the
    current stream of ``x``'s device."""
    fused = residual is not None
    return NormValues(x.data_ptr(), weight.data_ptr(), out.data_ptr(), residual.data_ptr() if fused else None,
                      residual_out.data_ptr() if fused else None, x.shape[0], x.shape[1], row_pitch(x),
                      row_pitch(out), row_pitch(residual) if fused else 0, row_pitch(residual_out) if fused else 0,
                      float(eps), current_stream_handle(x.device))


def check_eps(op, eps):
    """Raise a TypeError/ValueError unless ``eps`` is a finite, non-negative real number."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op} eps must be a float, got {type(eps).__name__}")
    if not isfinite(eps) or eps < 0:
        raise ValueError(f"{op} eps must be finite and non-negative, got {eps}")


def _check_output(op, name, tensor, like):
    """Raise unless a caller's output ``tensor`` has ``like``'s shape, dtype and device, and 16-byte rows."""
    check_tensor(op, name, tensor, dims=2, dtype=like.dtype, device=like.device)
    if tensor.shape != like.shape:
        raise ValueError(f"{op} {name} must be {tuple(like.shape)} like the input, got {tuple(tensor.shape)}")
    check_rows_alignment(op, name, tensor)
    check_writable(op, name, tensor)


def _check_inputs(op, x, weight, eps, programmatic_launch, residual=None):
    """Raise a TypeError/ValueError naming whatever the norm kernel cannot take about its inputs; returns the
    ``--gpu-arch`` of their device."""
    arch = check_tensor(op, "input", x, dims=2)
    check_rows_alignment(op, "input", x)
    check_tensor(op, "weight", weight, dims=1, dtype=x.dtype, device=x.device)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"{op} weight must be ({x.shape[1]},) like the input's rows, got {tuple(weight.shape)}")
    if weight.data_ptr() % 16:
        raise ValueError(f"{op} weight needs a 16-byte aligned base, got {weight.data_ptr():#x}")
    if residual is not None:
        check_tensor(op, "residual", residual, dims=2, dtype=x.dtype, device=x.device)
        if residual.shape != x.shape:
            raise ValueError(f"{op} residual must be {tuple(x.shape)} like the input, got {tuple(residual.shape)}")
        check_rows_alignment(op, "residual", residual)
    check_eps(op, eps)
    check_launch_flag(op, programmatic_launch)
    return arch


def rms_norm(x, weight, eps=1e-6, *, out=None, programmatic_launch=True):
    """``out = x / sqrt(mean(x^2, -1) + eps) * weight`` on ``x``'s current stream; returns ``out``.

    ``x`` [M, H] BF16/FP16 with H % 8 == 0, ``weight`` [H] of the same dtype; ``out`` (allocated if None) is
    [M, H] of that dtype and may be ``x`` itself (in place). Rows need unit stride and 16-byte aligned bases and
    pitches. Launches with programmatic dependent launch unless ``programmatic_launch`` is False. The first call
    per dtype compiles (about a second): make it before capturing a CUDA graph.
    """
    op = "rms_norm"
    arch = _check_inputs(op, x, weight, eps, programmatic_launch)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_output(op, "output", out, x)
    if x.shape[0] == 0:
        return out
    check_no_overlap(op, ("output", out), [("input", x, True), ("weight", weight, False)])
    code = compile_rms_norm(x.dtype, False, arch, programmatic_launch)
    launch(op, code, x.device, value_kinds(False), launch_values(x, weight, out, None, None, eps), x.dtype)
    increment_version(out)  # an in-place write autograd cannot see
    return out


def fused_add_rms_norm(x, residual, weight, eps=1e-6, *, out=None, residual_out=None, programmatic_launch=True):
    """``residual_out = x + residual`` (rounded once), ``out = rms_norm(residual_out) * weight``; returns both.

    Shapes and dtypes as ``rms_norm``, ``residual`` like ``x``. Outputs are allocated where None. Either may
    replace an input element for element: ``out=x`` and ``residual_out=residual`` is vLLM's in-place
    ``fused_add_rms_norm``; ``residual_out=x`` works too. ``out`` and ``residual_out`` must not overlap.
    """
    op = "fused_add_rms_norm"
    arch = _check_inputs(op, x, weight, eps, programmatic_launch, residual)
    outputs = {}
    for name, given in (("output", out), ("residual_out", residual_out)):
        if given is None:
            given = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        else:
            _check_output(op, name, given, x)
        outputs[name] = given
    out, residual_out = outputs["output"], outputs["residual_out"]
    if x.shape[0] == 0:
        return out, residual_out
    # ``out`` is written in the second pass, from ``residual_out``, which it must not touch; ``x`` and ``residual``
    # are read only in the first, by the thread that then writes those same elements.
    check_no_overlap(op, ("output", out), [
        ("input", x, True), ("residual", residual, True), ("residual_out", residual_out, False),
        ("weight", weight, False)])
    check_no_overlap(op, ("residual_out", residual_out), [
        ("input", x, True), ("residual", residual, True), ("weight", weight, False)])
    code = compile_rms_norm(x.dtype, True, arch, programmatic_launch)
    launch(op, code, x.device, value_kinds(True), launch_values(x, weight, out, residual, residual_out, eps),
           x.dtype)
    increment_version(out)
    increment_version(residual_out)
    return out, residual_out
