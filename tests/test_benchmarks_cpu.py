"""The start-up probe's kernels compile for sm_90a: the stamped glue (plain and PDL, before or after the stamped
kernel), an empty kernel with the projection's launch properties, the projection with its timeline stamps (a
subclass of SplitKGemm) and the read ceiling's kernel with its own."""

import sys
from pathlib import Path

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from decode_projection.kernel.splitk import SplitKGemm
from decode_projection.measure.ceiling import fake_bytes
from decode_projection.projection import kernel_arguments
from decode_projection.runtime.sass import kernel_report
from decode_projection.tactic import SplitKTactic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import startup_probe  # noqa: E402

ADDRESS = 1 << 32  # a stamp buffer's address, baked in as the probe does


@pytest.mark.slow
def test_every_probe_kernel_compiles_and_stamps():
    fake = make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16)
    for pdl in (False, True):
        for trailing in (False, True):
            glue = cute.compile(startup_probe.StampedGlue(ADDRESS, pdl, trailing), fake, make_fake_stream(),
                                options="--gpu-arch=sm_90a")
            # The glue before stamps its start and its end; the one after only its start.
            assert kernel_report(glue).sass.count("GLOBALTIMER") == (1 if trailing else 2)
    probe = startup_probe.LaunchProbe(ADDRESS, 200 * 1024, 4, 160, True, 100)
    assert kernel_report(cute.compile(probe, cutlass.Int32(1), make_fake_stream(), options="--gpu-arch=sm_90a"))
    tactic = SplitKTactic(128, 8, 3, 13)
    stamped = cute.compile(startup_probe.stamped_gemm(SplitKGemm)(tactic, True, ADDRESS),
                           *kernel_arguments(torch.bfloat16, torch.bfloat16), options="--gpu-arch=sm_90a")
    report = kernel_report(stamped)
    # Every event of the projection's timeline is written: entry, first TMA, producer past its wait, consumer
    # start, first stage full, epilogue and exit.
    assert report.sass.count("GLOBALTIMER") >= 7 and report.local_bytes == 0
    # The read ceiling's kernel beside it: entry, first and last chunk landed, exit.
    read = cute.compile(startup_probe.StampedRead(ADDRESS), fake_bytes(), cutlass.Int32(1), make_fake_stream(),
                        options="--gpu-arch=sm_90a")
    assert kernel_report(read).sass.count("GLOBALTIMER") >= 4


def test_tile_contiguous_boxes_are_the_weights():
    import tiled_weight

    n, k, rows = 112, 320, 56
    weight = torch.arange(n * k, dtype=torch.float32).reshape(n, k)
    tiled = tiled_weight.tile_contiguous(weight, rows)
    assert tiled.shape == (n * k // 64, 64) and tiled.is_contiguous()
    for weight_row in range(0, n, rows):
        for k_box in range(k // 64):
            first = tiled_weight.box_row(weight_row, k_box, rows, k // 64)
            box = weight[weight_row:weight_row + rows, k_box * 64:(k_box + 1) * 64]
            assert torch.equal(tiled[first:first + rows], box), (weight_row, k_box)


def test_tile_contiguous_reading_tactics():
    import tiled_weight

    assert tiled_weight.tiling_problems(SplitKTactic(128, 64, 1, 9), 7168, 768) == []
    assert tiled_weight.tiling_problems(SplitKTactic(56, 64, 2, 7, k_boxes=2), 7168, 1536) == []
    assert tiled_weight.tiling_problems(SplitKTactic(128, 64, 1, 9), 7168 + 64, 768)  # a partial tile
    assert tiled_weight.tiling_problems(SplitKTactic(128, 64, 1, 9), 7168, 776)  # a partial box
    assert tiled_weight.tiling_problems(SplitKTactic(16, 8, 1, 4, k_boxes=4, fold=4), 2112, 7168)
    assert tiled_weight.tiling_problems(SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True), 7168, 768)


@pytest.mark.slow
def test_tile_contiguous_probe_kernel_compiles():
    import tiled_weight

    tactic = SplitKTactic(56, 64, 2, 7, k_boxes=2)
    gemm = startup_probe.stamped_gemm(tiled_weight.tiled_weight_gemm(SplitKGemm, 1536))(tactic, False, ADDRESS)
    report = kernel_report(cute.compile(gemm, *kernel_arguments(torch.bfloat16, torch.bfloat16),
                                        options="--gpu-arch=sm_90a"))
    assert report.sass.count("UTMALDG") >= 2 and report.local_bytes == 0
