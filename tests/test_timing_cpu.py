"""Timing helpers that need no GPU."""

import pytest

from decode_projection.timing import foreign_kernel, whole_rotations


def test_glue_kernel_refuses_the_cpu():
    # A CPU tensor would put nothing on the GPU between the launches the glue should separate.
    with pytest.raises(ValueError, match="CUDA device"):
        foreign_kernel("cpu")


def test_every_timed_replay_rotates_through_whole_sets_of_copies():
    for copies in range(2, 60):
        launches = whole_rotations(copies)
        assert launches % copies == 0 and launches >= max(40, 2 * copies) and launches < max(40, 2 * copies) + copies
