"""Timing helpers that need no GPU."""

import pytest

from decode_projection.timing import foreign_kernel


def test_glue_kernel_refuses_the_cpu():
    # A CPU tensor would put nothing on the GPU between the launches the glue should separate.
    with pytest.raises(ValueError, match="CUDA device"):
        foreign_kernel("cpu")
