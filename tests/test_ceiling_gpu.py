"""GPU test of the read-only ceiling kernel: it must really read every byte."""

import pytest
import torch

from decode_projection.ceiling import stream_read
from decode_projection.timing import cold_copies, graph_time_us

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,k", [(8448, 7168), (20480, 7168)])
def test_read_ceiling_is_physical(n, k):
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    us = graph_time_us(lambda i: stream_read(weights[i]), copies)
    terabytes_per_second = n * k * 2 / us / 1e6
    # Skipping bytes shows up as an impossible rate (above the 4.8 TB/s datasheet figure).
    assert 2.0 < terabytes_per_second < 5.0, f"{terabytes_per_second:.2f} TB/s"
