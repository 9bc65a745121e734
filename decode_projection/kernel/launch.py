"""The compiled entry point of a projection: what changes from call to call arrives as pointers and integers.

A prepared projection's weight (and bias) are CuTe tensors built once. The activations, the output and the
residual change with every call, and a DLPack conversion of each per call would take most of an eager call's
host time (docs/host-cost.md), so they arrive as bare pointers with the batch and their row pitches, and their
tensors are built here, inside the compiled host function, with the types of a DLPack view with a dynamic layout:
every extent dynamic, the activations' pitch a multiple of 16 bytes (TMA), the output's and the residual's
unconstrained (scripts/sass_identity.py pins the kernels' SASS).
"""

import ctypes
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute

from ..runtime.sm90 import TMA_ALIGN
from .splitk import SplitKGemm


class LaunchValues(NamedTuple):
    """``SplitKLaunch``'s arguments after the weight and the bias, in its order. As a launch passes them: the
    addresses of the activations, the output and the residual (None without one), the batch, the output's rows
    (N), the three row pitches in elements (0 without a residual) and the stream's handle."""

    activations: object
    out: object
    residual: object
    batch: object
    output_rows: object
    activation_pitch: object
    out_pitch: object
    residual_pitch: object
    stream: object


# The C type the compiled function takes each value as (runtime/call_slots.py).
VALUE_KINDS = LaunchValues(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                           ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
# The DSL's types of the batch, the output rows and the three pitches, as SplitKLaunch declares them.
EXTENT_TYPES = (cutlass.Int32, cutlass.Int32, cutlass.Int64, cutlass.Int64, cutlass.Int64)


def tma_pitch_multiple(element_type) -> int:
    """The elements of ``element_type`` (a CuTe numeric type) in TMA_ALIGN bytes: a TMA operand's row pitch is a
    multiple of it."""
    return TMA_ALIGN * 8 // element_type.width


class SplitKLaunch:
    """``gemm`` launched on pointer operands: activations (batch, K, 1) K-major, output and residual
    (output_rows, batch, 1) N-major, each with its row pitch in elements; K and the unit third extent are the
    weight's own."""

    def __init__(self, gemm: SplitKGemm):
        self.gemm = gemm

    @cute.jit
    def __call__(
        self,
        weight: cute.Tensor,
        bias: Optional[cute.Tensor],
        activations: cute.Pointer,
        out: cute.Pointer,
        residual: Optional[cute.Pointer],
        batch: cutlass.Int32,
        output_rows: cutlass.Int32,
        activation_pitch: cutlass.Int64,
        out_pitch: cutlass.Int64,
        residual_pitch: cutlass.Int64,
        stream,
    ):
        """Build the three tensors and launch ``gemm`` on ``stream``."""
        k, unit = weight.shape[1], weight.shape[2]
        # The weight's extents are dynamic, so these are too: the types a DLPack view with a dynamic layout has.
        activation_tensor = cute.make_tensor(activations, cute.make_layout(
            (batch, k, unit),
            stride=(cute.assume(activation_pitch, divby=tma_pitch_multiple(weight.element_type)), 1, 0)))
        out_tensor = cute.make_tensor(out, cute.make_layout((output_rows, batch, unit), stride=(1, out_pitch, 0)))
        residual_tensor = None
        if cutlass.const_expr(residual is not None):
            residual_tensor = cute.make_tensor(
                residual, cute.make_layout((output_rows, batch, unit), stride=(1, residual_pitch, 0)))
        self.gemm(weight, activation_tensor, out_tensor, stream, residual_tensor, bias)
