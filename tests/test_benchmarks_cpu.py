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



@pytest.mark.parametrize("tactic", [
    SplitKTactic(56, 32, 1, 4, k_boxes=2),  # a padded tile in 2-box stages
    SplitKTactic(64, 8, 3, 6),  # split K: each rank's slice starts at its own K tile
    SplitKTactic(64, 128, 1, 9, multicast=4, column_groups=2),  # activations shared, weight tiles not
])
def test_every_load_of_the_tile_contiguous_copy_is_its_weight_box(tactic):
    import tiled_weight

    n, k = 448, 384
    assert not tiled_weight.tiling_problems(tactic, n, k)
    weight = torch.arange(n * k, dtype=torch.float32).reshape(n, k)
    tiled = tiled_weight.tile_contiguous(weight, tactic.weight_load_rows)
    rows = tactic.weight_load_rows
    loads = 0
    for tile in range(-(-n // tactic.weight_rows)):  # the kernel's weight tiles, each rank of its split
        weight_row = tile * tactic.weight_rows
        for rank in range(tactic.split):
            first, stages, _ = tactic.k_slice(k, rank)
            for k_tile in range(first, first + stages):
                for box in range(tactic.k_boxes):
                    row = tiled_weight.box_row(tactic, weight_row, k_tile, box, k // 64)
                    column = (k_tile * tactic.k_boxes + box) * 64
                    assert torch.equal(tiled[row:row + rows], weight[weight_row:weight_row + rows, column:column + 64])
                    loads += 1
    assert loads == n // rows * k // 64  # every box of the weight, once


def test_tile_contiguous_reading_tactics():
    import tiled_weight

    assert tiled_weight.tiling_problems(SplitKTactic(128, 64, 1, 9), 7168, 768) == []
    assert tiled_weight.tiling_problems(SplitKTactic(56, 64, 2, 7, k_boxes=2), 7168, 1536) == []
    assert tiled_weight.tiling_problems(SplitKTactic(128, 64, 1, 9), 7168 + 64, 768)  # a partial tile
    assert tiled_weight.tiling_problems(SplitKTactic(128, 64, 1, 9), 7168, 776)  # a partial box
    assert tiled_weight.tiling_problems(SplitKTactic(56, 32, 1, 4, k_boxes=2), 7168, 320)  # a partial stage
    assert tiled_weight.tiling_problems(SplitKTactic(16, 8, 1, 4, k_boxes=4, fold=4), 2112, 7168)
    assert tiled_weight.tiling_problems(SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True), 7168, 768)


def test_every_bulk_copy_lands_the_image_a_swizzled_tma_load_of_its_box_writes():
    import tiled_weight

    tactic = SplitKTactic(56, 64, 2, 7, k_boxes=2)
    n, k = 112, 512
    weight = torch.randn(n, k).to(torch.bfloat16)
    stored = tiled_weight.layout_copy(weight, tactic.weight_load_rows, "bulk").view(torch.uint8).reshape(-1)
    loads = 0
    for weight_row in range(0, n, tactic.weight_rows):
        for rank in range(tactic.split):
            first, stages, _ = tactic.k_slice(k, rank)
            for k_tile in range(first, first + stages):
                for box in range(tactic.k_boxes):
                    row = tiled_weight.box_row(tactic, weight_row, k_tile, box, k // 64)
                    start, size = tiled_weight.bulk_box(tactic, row)
                    image = stored[start:start + size]  # what the 1-D copy lands at a 1024-byte aligned tile
                    column = (k_tile * tactic.k_boxes + box) * 64
                    expected = weight[weight_row:weight_row + tactic.weight_load_rows, column:column + 64]
                    expected = expected.contiguous().view(torch.uint8).reshape(-1)
                    assert size == expected.numel()
                    for offset in range(0, size, 16):
                        # SWIZZLE_128B: byte address bits [4, 7) XOR bits [7, 10).
                        swizzled = offset ^ (((offset >> 7) & 7) << 4)
                        assert torch.equal(image[swizzled:swizzled + 16], expected[offset:offset + 16]), \
                            (weight_row, k_tile, box, offset)
                    loads += 1
    assert loads == n // tactic.weight_load_rows * k // 64  # every box of the weight, once
    with pytest.raises(ValueError, match="not one of"):
        tiled_weight.layout_copy(weight, 56, "rows")


@pytest.mark.slow
def test_tile_contiguous_probe_kernel_compiles():
    import tiled_weight

    tactic = SplitKTactic(56, 64, 2, 7, k_boxes=2)
    arguments = kernel_arguments(torch.bfloat16, torch.bfloat16)
    reports = [kernel_report(cute.compile(startup_probe.stamped_gemm(gemm)(tactic, False, ADDRESS), *arguments,
                                          options="--gpu-arch=sm_90a"))
               for gemm in (SplitKGemm, tiled_weight.tiled_weight_gemm(SplitKGemm, 1536))]
    ours, tiled = reports
    assert tiled.sass.count("UTMALDG") == ours.sass.count("UTMALDG") >= 2 and tiled.local_bytes == 0
    assert tiled.sass != ours.sass  # the override's coordinates, not the base class's


@pytest.mark.slow
def test_bulk_copy_probe_kernel_loads_the_weight_without_a_tensor_map():
    import tiled_weight

    tactic = SplitKTactic(56, 64, 2, 7, k_boxes=2)
    arguments = kernel_arguments(torch.bfloat16, torch.bfloat16)
    ours, bulk = [kernel_report(cute.compile(startup_probe.stamped_gemm(gemm)(tactic, False, ADDRESS), *arguments,
                                             options="--gpu-arch=sm_90a"))
                  for gemm in (SplitKGemm, tiled_weight.tiled_weight_gemm(SplitKGemm, 1536, "bulk"))]
    # The activations keep their tensor map: one TMA load per activation box, where ours has the weight's too.
    assert 1 <= bulk.sass.count("UTMALDG") < ours.sass.count("UTMALDG")
    assert bulk.sass.count("UBLKCP") >= tactic.k_boxes and "UBLKCP" not in ours.sass and bulk.local_bytes == 0


@pytest.mark.slow
def test_weight_map_variants_leave_out_the_acquire_the_prefetch_or_both_or_pass_the_map_by_value():
    import map_variants

    tactic = SplitKTactic(56, 64, 2, 7, k_boxes=2)
    arguments = kernel_arguments(torch.bfloat16, torch.bfloat16)
    gemms = {"ours": SplitKGemm} | {v: map_variants.map_variant_gemm(SplitKGemm, v) for v in map_variants.VARIANTS}
    sass = {name: kernel_report(cute.compile(startup_probe.stamped_gemm(gemm)(tactic, False, ADDRESS), *arguments,
                                             options="--gpu-arch=sm_90a")).sass
            for name, gemm in gemms.items()}
    # The acquire is the map's invalidation in the TMA unit (UTMACCTL.IV), the prefetch UTMACCTL.PF; the activation
    # map's prefetch stays in every variant.
    acquires = {name: text.count("UTMACCTL.IV") for name, text in sass.items()}
    prefetches = {name: text.count("UTMACCTL.PF") for name, text in sass.items()}
    assert acquires["ours"] == acquires["no-prefetch"] > acquires["no-acquire"] == acquires["neither"]
    assert prefetches["ours"] == prefetches["no-acquire"] > prefetches["no-prefetch"] == prefetches["neither"] >= 1
    # Passed by value, the map is prefetched and never acquired.
    assert acquires["by-value"] == 0 and prefetches["by-value"] == prefetches["ours"]
    assert all(text.count("UTMALDG") == sass["ours"].count("UTMALDG") for text in sass.values())
    with pytest.raises(ValueError, match="not one of"):
        map_variants.map_variant_gemm(SplitKGemm, "late")
