"""SiLU-and-mul: PDL-aware decode glue between a gate_up projection and its down projection (sm_90a, CuTe DSL).

For ``x [M, 2N]`` (BF16 or FP16) whose rows hold the gate then the up half, as vLLM's ``silu_and_mul`` takes
them::

    out[m, n] = silu(x[m, n]) * x[m, N + n],    silu(g) = g / (1 + exp(-g))

computed in FP32 and rounded once. (PyTorch's ``F.silu(g) * u`` rounds ``silu(g)`` first: two roundings.)

Each thread computes one 16-byte vector of 8 outputs; a CTA covers ``THREADS`` vectors of one row, the grid is
(rows, vectors of a row / THREADS). Each output depends on its own two inputs only: bitwise repeatable and the
same whatever the batch. Programmatic dependent launch: the kernel triggers its dependents as it starts and
waits on its predecessor before reading (see ``SiluAndMul.kernel``).

The compiled entry point (``SiluAndMul.__call__``) takes the operands as pointers with the rows, N and the two
row pitches (``SiluValues``), which ``rowwise.launch`` writes into call slots (docs/host-cost.md).
"""

import ctypes
from functools import cache
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream
from torch.autograd.graph import increment_version

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
    vectors,
)

THREADS = 128  # vectors (of 8 outputs) per CTA


class SiluValues(NamedTuple):
    """``SiluAndMul.__call__``'s arguments, in its order, as a launch passes them: the addresses of the gate half,
    the up half (of x) and out, the rows, N, x's and out's row pitches in elements and the stream's handle."""

    gate: object
    up: object
    out: object
    rows: object
    width: object
    x_pitch: object
    out_pitch: object
    stream: object


# The C type the compiled function takes each value as (runtime/call_slots.py).
VALUE_KINDS = SiluValues(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)


class SiluAndMul:
    """out (M, N) = silu(gate (M, N)) * up (M, N), gate and up any two row views (the halves of one buffer).

    Contracts (checked on the host): rows with unit stride, 16-byte aligned bases and row pitches, N % 8 == 0,
    one dtype (BF16 or FP16); ``out`` overlaps neither input.
    """

    def __init__(self, programmatic_launch: bool = True, threads: int = THREADS):
        if threads % 32 or not 32 <= threads <= 1024:
            raise ValueError(f"SiluAndMul threads must be a multiple of 32 in 32..1024, got {threads}")
        # The launch attribute only: without it the kernel's griddepcontrol instructions do nothing.
        self.programmatic_launch = programmatic_launch
        self.threads = threads

    @cute.jit
    def __call__(
        self,
        gate: cute.Pointer,
        up: cute.Pointer,
        out: cute.Pointer,
        rows: cutlass.Int32,
        width: cutlass.Int32,
        x_pitch: cutlass.Int64,
        out_pitch: cutlass.Int64,
        stream,
    ):
        """Build the operands' (rows, N) tensors and launch (rows, ceil(N / 8 / threads)) CTAs on ``stream``."""
        gate_rows, up_rows = rows_tensor(gate, rows, width, x_pitch), rows_tensor(up, rows, width, x_pitch)
        out_rows = rows_tensor(out, rows, width, out_pitch)
        blocks = cute.ceil_div(cute.ceil_div(out_rows.shape[1], VECTOR), self.threads)
        self.kernel(gate_rows, up_rows, out_rows).launch(
            grid=(rows, blocks, 1),
            block=(self.threads, 1, 1),
            stream=stream,
            use_pdl=self.programmatic_launch,
        )

    @cute.kernel
    def kernel(self, gate: cute.Tensor, up: cute.Tensor, out: cute.Tensor):
        """One vector of 8 outputs per thread."""
        tidx, _, _ = cute.arch.thread_idx()
        row, block, _ = cute.arch.block_idx()
        # Safe at the very start: a dependent reads ``out`` only after its own griddepcontrol.wait, which returns once
        # this whole grid has completed and flushed its writes; the early trigger only lets its CTAs start (and
        # stream their weights) sooner, and fires once every CTA of this grid is resident.
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()  # the inputs are the previous kernel's output
        i = block * self.threads + tidx
        if i < out.shape[1] // VECTOR:
            g = vectors(gate, row)[None, i].load().to(cutlass.Float32)
            u = vectors(up, row)[None, i].load().to(cutlass.Float32)
            silu = g / (cutlass.Float32(1.0) + cute.math.exp(-g))
            vectors(out, row)[None, i].store((silu * u).to(out.element_type))


def compile_silu_and_mul(dtype, arch, programmatic_launch=True):
    """The SiLU-and-mul kernel for one dtype, compiled once (symbolic batch, width, pitches and pointers)."""
    check_dtype("silu_and_mul", dtype)
    check_launch_flag("silu_and_mul", programmatic_launch)
    return _compile(dtype, arch, programmatic_launch)


@cache
def _compile(dtype, arch, programmatic_launch):
    """compile_silu_and_mul on normalized arguments (one entry however they were passed)."""
    args = dsl_arguments(VALUE_KINDS, placeholder_values(VALUE_KINDS), dtype, make_fake_stream())
    with compile_lock:  # cute.compile is not thread-safe
        return cute.compile(SiluAndMul(programmatic_launch), *args, options=f"--gpu-arch={arch}")


def launch_values(x, out) -> SiluValues:
    """One launch's ``SiluValues``: a checked input [M, 2N] and output [M, N], on the current stream of ``x``'s
    device."""
    rows, n = out.shape
    return SiluValues(x.data_ptr(), x.data_ptr() + n * x.element_size(), out.data_ptr(), rows, n, row_pitch(x),
                      row_pitch(out), current_stream_handle(x.device))


def silu_and_mul(x, *, out=None, programmatic_launch=True):
    """``out = silu(x[:, :N]) * x[:, N:]`` for ``x`` [M, 2N] on its current stream; returns ``out`` [M, N].

    BF16/FP16, N % 8 == 0; ``out`` (allocated if None) of ``x``'s dtype, overlapping nothing of ``x``. Rows need
    unit stride and 16-byte aligned bases and pitches. Launches with programmatic dependent launch unless
    ``programmatic_launch`` is False. The first call per dtype compiles (about a second): make it before
    capturing a CUDA graph.
    """
    op = "silu_and_mul"
    arch = check_tensor(op, "input", x, dims=2)
    rows, width = x.shape
    if width == 0 or width % (2 * VECTOR):
        raise ValueError(f"{op} input must be [M, 2N] with N a positive multiple of {VECTOR}, got {tuple(x.shape)}")
    check_rows_alignment(op, "input", x)
    check_launch_flag(op, programmatic_launch)
    n = width // 2
    if out is None:
        out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    else:
        check_tensor(op, "output", out, dims=2, dtype=x.dtype, device=x.device)
        if tuple(out.shape) != (rows, n):
            raise ValueError(f"{op} output must be {(rows, n)} for input {tuple(x.shape)}, got {tuple(out.shape)}")
        check_rows_alignment(op, "output", out)
        check_writable(op, "output", out)
    if rows == 0:
        return out
    check_no_overlap(op, ("output", out), [("input", x, False)])
    code = compile_silu_and_mul(x.dtype, arch, programmatic_launch)
    launch(op, code, x.device, VALUE_KINDS, launch_values(x, out), x.dtype)
    increment_version(out)
    return out
