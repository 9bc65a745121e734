"""Split-K weight projections for LLM decode on NVIDIA Hopper, in the CuTe DSL."""

from .projection import PreparedProjection, compile_projection, matrix_view, weight_map
from .splitk import SplitKGemm
from .tactic import SplitKTactic

__all__ = [
    "PreparedProjection",
    "SplitKGemm",
    "SplitKTactic",
    "compile_projection",
    "matrix_view",
    "weight_map",
]
