"""The compiled entry point of a projection: what changes from call to call arrives as pointers and integers.

A prepared projection's weight (and bias) are CuTe tensors built once. The activations, the output and the
residual change with every call; converting each to a CuTe tensor through DLPack cost about 20 us of host time
per call (docs/host-cost.md), so they arrive as bare pointers with their rows and row pitches, and their
tensors are built here, inside the compiled host function, with exactly the types the kernel was written for:
every extent dynamic, the activations' pitch a multiple of 16 bytes (TMA), the output's and the residual's
unconstrained. The kernel's SASS is the same either way (scripts/sass_identity.py).
"""

from typing import Optional

import cutlass
import cutlass.cute as cute

from ..runtime.sm90 import TMA_ALIGN
from .splitk import SplitKGemm


def tma_pitch_multiple(element_type) -> int:
    """The elements of ``element_type`` (a CuTe numeric type) in TMA_ALIGN bytes: a TMA operand's row pitch is a
    multiple of it."""
    return TMA_ALIGN * 8 // element_type.width


class SplitKLaunch:
    """``gemm`` launched on pointer operands: activations (rows, K, 1) K-major, output and residual
    (out_columns, rows, 1) N-major, each with its row pitch in elements; K and the unit third extent are the
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
        rows: cutlass.Int32,
        out_columns: cutlass.Int32,
        activation_pitch: cutlass.Int64,
        out_pitch: cutlass.Int64,
        residual_pitch: cutlass.Int64,
        stream,
    ):
        """Build the three tensors and launch ``gemm`` on ``stream``."""
        k, unit = weight.shape[1], weight.shape[2]
        # The weight's extents are dynamic, so are these: the same tensor types as a DLPack view with a dynamic
        # layout gives, hence the same kernel.
        activation_tensor = cute.make_tensor(activations, cute.make_layout(
            (rows, k, unit),
            stride=(cute.assume(activation_pitch, divby=tma_pitch_multiple(weight.element_type)), 1, 0)))
        out_tensor = cute.make_tensor(out, cute.make_layout((out_columns, rows, unit), stride=(1, out_pitch, 0)))
        residual_tensor = None
        if cutlass.const_expr(residual is not None):
            residual_tensor = cute.make_tensor(
                residual, cute.make_layout((out_columns, rows, unit), stride=(1, residual_pitch, 0)))
        self.gemm(weight, activation_tensor, out_tensor, stream, residual_tensor, bias)
