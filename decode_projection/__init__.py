"""Split-K weight projections for LLM decode on NVIDIA Hopper, in the CuTe DSL."""

from .activation import silu_and_mul
from .norm import fused_add_rms_norm, rms_norm
from .projection import PreparedProjection, compile_projection, matrix_view, weight_map
from .tactic import SplitKTactic

__version__ = "0.2.0.dev0"

__all__ = [
    "PreparedProjection",
    "ProjectionLinear",
    "SplitKTactic",
    "compile_projection",
    "fused_add_rms_norm",
    "matrix_view",
    "rms_norm",
    "silu_and_mul",
    "swap_linears",
    "weight_map",
]


def __getattr__(name):
    # The layer is imported on first use: importing it registers the decode_projection::project custom op,
    # which a second copy of the package in the same process (scripts/ab-check) must not register again.
    # The same holds for swap_linears, which builds layers.
    if name == "ProjectionLinear":
        from .layer import ProjectionLinear

        return ProjectionLinear
    if name == "swap_linears":
        from .swap import swap_linears

        return swap_linears
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
