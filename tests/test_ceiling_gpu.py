"""GPU tests of the read-only ceiling kernel (it must really read every byte), of interleaved timing and of the
launch contexts (the PDL-aware glue among them)."""

import pytest
import torch

from decode_projection import PreparedProjection
from decode_projection.measure.ceiling import stream_read
from decode_projection.measure.checks import Reference
from decode_projection.measure.glue import pdl_glue
from decode_projection.measure.timing import (CONTEXTS, LaunchContexts, cold_copies, foreign_kernel, graph_time_us,
                                      interleaved_time_us)

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


@pytest.mark.parametrize("shape", [(1, 8), (3, 7168), (256, 14336)])
def test_the_pdl_glue_copies_its_source(shape):
    source = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    x = torch.full_like(source, float("nan"))
    pdl_glue(source, x)()
    torch.cuda.synchronize()
    assert torch.equal(x, source)


def test_a_projection_and_torch_matmul_are_checked_and_timed_in_every_context():
    n, k, batch = 2304, 1536, 16
    copies = cold_copies(n * k * 2)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    projections = [PreparedProjection.for_weight(w, batches=(batch,)) for w in weights]
    launches = {"ours": lambda i: projections[i].run(x, outs[i]),
                "torch.matmul": lambda i: torch.matmul(x, weights[i].T, out=outs[i])}
    around = LaunchContexts(list(CONTEXTS), x)
    reference = Reference(x, weights[0], torch.bfloat16)
    for label, launch in launches.items():
        around.check(launch, outs[0], reference, label=label)
    times = around.time_us(launches, copies, repeats=5)
    assert set(times) == {(context, name) for context in CONTEXTS for name in launches}
    # Each a few microseconds, with the glue's own time taken off (a 7 MB weight streams in about 2 us).
    assert all(1.0 < us < 30.0 for us in times.values()), times
