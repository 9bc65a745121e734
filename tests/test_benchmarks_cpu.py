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

from decode_projection.kernel.launch import SplitKLaunch
from decode_projection.kernel.splitk import SplitKGemm
from decode_projection.kernel.tactic import SplitKTactic
from decode_projection.measure.ceiling import fake_bytes
from decode_projection.projection import kernel_arguments
from decode_projection.runtime.sass import kernel_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import startup_probe  # noqa: E402

ADDRESS = 1 << 32  # a stamp buffer's address, baked in as the probe does


@pytest.mark.slow
def test_every_probe_kernel_compiles_and_stamps():
    fake = make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16)
    for pdl, trailing, carveout in ((False, False, None), (False, True, None), (True, False, None),
                                    (True, True, None), (False, False, 100)):
        glue = cute.compile(startup_probe.StampedGlue(ADDRESS, pdl, trailing, carveout), fake, make_fake_stream(),
                            options="--gpu-arch=sm_90a")
        # The glue before stamps its start and its end; the one after only its start.
        assert kernel_report(glue).sass.count("GLOBALTIMER") == (1 if trailing else 2)
    assert set(startup_probe.AFTER_MAX_SHARED_GLUE) <= set(startup_probe.LAUNCH_VARIANTS)
    probe = startup_probe.LaunchProbe(ADDRESS, 200 * 1024, 4, 160, True, 100)
    assert kernel_report(cute.compile(probe, cutlass.Int32(1), make_fake_stream(), options="--gpu-arch=sm_90a"))
    tactic = SplitKTactic(128, 8, 3, 13)
    stamped = cute.compile(SplitKLaunch(startup_probe.stamped_gemm(SplitKGemm)(tactic, True, ADDRESS)),
                           *kernel_arguments(torch.bfloat16, torch.bfloat16), options="--gpu-arch=sm_90a")
    report = kernel_report(stamped)
    # Every event of the projection's timeline is written: entry, first TMA, producer past its wait, consumer
    # start, first stage full, epilogue and exit.
    assert report.sass.count("GLOBALTIMER") >= 7 and report.local_bytes == 0
    # The read ceiling's kernel beside it: entry, first and last chunk landed, exit.
    read = cute.compile(startup_probe.StampedRead(ADDRESS), fake_bytes(), cutlass.Int32(1), make_fake_stream(),
                        options="--gpu-arch=sm_90a")
    assert kernel_report(read).sass.count("GLOBALTIMER") >= 4

