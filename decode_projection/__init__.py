"""Split-K weight projections for LLM decode on NVIDIA Hopper, in the CuTe DSL."""

from .projection import PreparedProjection, compile_projection, matrix_view, weight_map
from .tactic import SplitKTactic

__version__ = "0.2.0.dev0"

__all__ = [
    "PreparedProjection",
    "ProjectionLinear",
    "SplitKTactic",
    "compile_projection",
    "matrix_view",
    "weight_map",
]


def __getattr__(name):
    # The layer is imported on first use: importing it registers the decode_projection::project custom op,
    # which a second copy of the package in the same process (scripts/ab-check) must not register again.
    if name == "ProjectionLinear":
        from .layer import ProjectionLinear

        return ProjectionLinear
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
