"""GPU tests of the read-only ceiling kernel (it must really read every byte) and of interleaved timing."""

import pytest
import torch

from decode_projection.ceiling import stream_read
from decode_projection.timing import cold_copies, foreign_kernel, graph_time_us, interleaved_time_us

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,k", [(8448, 7168), (20480, 7168)])
def test_read_ceiling_is_physical(n, k):
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    us = graph_time_us(lambda i: stream_read(weights[i]), copies)
    terabytes_per_second = n * k * 2 / us / 1e6
    # Skipping bytes shows up as an impossible rate (above the 4.8 TB/s datasheet figure).
    assert 2.0 < terabytes_per_second < 5.0, f"{terabytes_per_second:.2f} TB/s"


def test_interleaved_timing_tells_launches_apart():
    n, k = 8448, 7168
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    halves = [w[: n // 2] for w in weights]
    glue = foreign_kernel("cuda")
    times = interleaved_time_us(
        {"whole": lambda i: stream_read(weights[i]), "half": lambda i: stream_read(halves[i])}, copies,
        separators={"whole": glue, "half": glue},
    )
    # Half the bytes stream in about half the time; the separator's own time is taken off both.
    assert 0.4 < times["half"] / times["whole"] < 0.65, times
