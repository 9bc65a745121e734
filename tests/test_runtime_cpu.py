"""CPU tests for the host glue (runtime.py) and the compile-only SASS reports (sass.py).

Nothing here needs a GPU: CUDA queries are faked where the code under test
only consumes their answers, kernels are compiled for sm_90a against fake
tensors.
"""

import types

import pytest
import torch
from cuda.bindings import driver

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.nvgpu.common import OperandMajorMode
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

try:
    from cutlass.memory import SmemAllocator
    from cutlass.tensor_utils import LayoutEnum
except ImportError:  # the CuTe DSL 4.7 has them in cutlass.utils only (where 4.8 deprecates them)
    from cutlass.utils import LayoutEnum, SmemAllocator

from decode_projection import runtime
from decode_projection.runtime import sass


# ---------------------------------------------------------------- architecture


def fake_capability(monkeypatch, capability):
    """Make torch report ``capability`` for every CUDA device."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


def test_architecture_hopper_is_sm90a(monkeypatch):
    fake_capability(monkeypatch, (9, 0))
    assert runtime.architecture(torch.device("cuda:0")) == "sm_90a"
    assert runtime.architecture("cuda:3") == "sm_90a"


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_architecture_rejects_other_gpus(monkeypatch, capability):
    fake_capability(monkeypatch, capability)
    major, minor = capability
    with pytest.raises(ValueError, match=rf"cuda:1 has compute capability {major}\.{minor}"):
        runtime.architecture(torch.device("cuda:1"))


def test_architecture_rejects_non_cuda_device(monkeypatch):
    def no_query(device=None):
        raise AssertionError("a CPU device must be refused before any CUDA query")

    monkeypatch.setattr(torch.cuda, "get_device_capability", no_query)
    with pytest.raises(ValueError, match="got cpu"):
        runtime.architecture(torch.device("cpu"))


# ---------------------------------------------------------------- stream, tensors


def test_current_stream_wraps_the_torch_handle(monkeypatch):
    asked = []

    def fake_current_stream(device=None):
        asked.append(device)
        return types.SimpleNamespace(cuda_stream=0x1234)

    monkeypatch.setattr(torch.cuda, "current_stream", fake_current_stream)
    stream = runtime.current_stream(torch.device("cuda:2"))
    assert isinstance(stream, driver.CUstream)
    assert int(stream) == 0x1234
    assert asked == [torch.device("cuda:2")]


def test_to_cute_keeps_pitch_shape_and_dtype():
    # A row slice of a wider buffer: the row pitch (72) must survive.
    wide = torch.randn(64, 72).to(torch.bfloat16)
    view = wide[:, :64].as_strided((64, 64, 1), (72, 1, 0))
    tensor = runtime.to_cute(view)
    assert tuple(tensor.shape) == (64, 64, 1)
    assert tuple(tensor.stride) == (72, 1, 0)
    assert tensor.element_type == cutlass.BFloat16


def test_to_cute_refuses_misaligned_pointer():
    base = torch.zeros(64, dtype=torch.bfloat16)
    assert base.data_ptr() % 16 == 0
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        runtime.to_cute(base[1:])


# ---------------------------------------------------------------- SASS reports


def test_nvdisasm_comes_from_the_wheel():
    path = sass.nvdisasm_path()
    assert "site-packages" in path and path.endswith("/bin/nvdisasm")


def test_opcode_counts_reads_predicated_and_modified_opcodes():
    listing = """
        /*0040*/                   UTMALDG.2D [UR8], [UR4], desc[URZ] ;
        /*0050*/              @!P0 SYNCS.PHASECHK.TRANS64 P0, [R3+URZ], R2 ;
        /*0060*/               @P1 STL.64 [R1+0x8], R4 ;
        /*0070*/             @!UPT HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0080*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        // HGMMA in a comment is not an instruction
    """
    counts = sass.opcode_counts(listing)
    assert counts == {"UTMALDG": 1, "SYNCS": 1, "STL": 1, "HGMMA": 2}


@cute.kernel
def _double_kernel(src: cute.Tensor, dst: cute.Tensor):
    """dst = 2 * src, one element per thread: plain loads and stores, no wgmma."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < src.shape[0]:
        dst[i] = src[i] * 2.0


@cute.jit
def _double(src: cute.Tensor, dst: cute.Tensor, stream):
    n = src.shape[0]
    _double_kernel(src, dst).launch(grid=((n + 127) // 128, 1, 1), block=(128, 1, 1), stream=stream)


@cute.kernel
def _local_array_kernel(src: cute.Tensor, dst: cute.Tensor):
    """A 300-float per-thread array written at a runtime index: more than the
    255 registers a thread can have, so it must live in local memory."""
    tidx, _, _ = cute.arch.thread_idx()
    values = cute.make_rmem_tensor((300,), cutlass.Float32)
    for i in cutlass.range(300, unroll_full=True):
        values[i] = src[i * 128 + tidx]
    j = src[tidx].to(cutlass.Int32) % 300
    values[j] = src[j]
    dst[tidx] = values[src[tidx + 1].to(cutlass.Int32) % 300]


@cute.jit
def _local_array(src: cute.Tensor, dst: cute.Tensor, stream):
    _local_array_kernel(src, dst).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


class _OneTileGemm:
    """C[0:64, 0:64] = A[0:64, :64] @ B[0:64, :64]^T in FP32, A and B BF16 K-major.

    The smallest Hopper pipeline there is: one CTA, one warpgroup, one TMA
    load per operand on one mbarrier, then four 64x64x16 wgmmas."""

    tile = (64, 64, 64)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        mma = sm90.make_trivial_tiled_mma(
            cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K, OperandMajorMode.K,
            cutlass.Float32, (1, 1, 1), tiler_mn=(64, 64),
        )
        a_layout = cute.slice_(sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, self.tile, cutlass.BFloat16, 1), (None, None, 0))
        b_layout = cute.slice_(sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, self.tile, cutlass.BFloat16, 1), (None, None, 0))
        a_atom, a_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), a, a_layout, (64, 64))
        b_atom, b_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), b, b_layout, (64, 64))

        @cute.struct
        class Storage:
            barrier: cute.struct.MemRange[cutlass.Int64, 1]
            # 1024-byte alignment: what the 128-byte swizzle pattern repeats over.
            a: cute.struct.Align[cute.struct.MemRange[cutlass.BFloat16, cute.cosize(a_layout)], 1024]
            b: cute.struct.Align[cute.struct.MemRange[cutlass.BFloat16, cute.cosize(b_layout)], 1024]

        self.storage = Storage
        self.kernel(a_atom, a_tma, b_atom, b_tma, c, mma, a_layout, b_layout).launch(
            grid=(1, 1, 1), block=(128, 1, 1), smem=Storage.size_in_bytes(), stream=stream
        )

    @cute.kernel
    def kernel(self, a_atom: cute.CopyAtom, a_tma: cute.Tensor, b_atom: cute.CopyAtom, b_tma: cute.Tensor,
               c: cute.Tensor, mma: cute.TiledMma, a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        storage = SmemAllocator().allocate(self.storage)
        barrier = storage.barrier.data_ptr()
        sA = storage.a.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sB = storage.b.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        if tidx == 0:
            cute.arch.mbarrier_init(barrier, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        one_cta = cute.make_layout(1)
        a_smem, a_gmem = cpasync.tma_partition(
            a_atom, 0, one_cta, cute.group_modes(sA, 0, 2),
            cute.group_modes(cute.local_tile(a_tma, (64, 64), (0, 0)), 0, 2))
        b_smem, b_gmem = cpasync.tma_partition(
            b_atom, 0, one_cta, cute.group_modes(sB, 0, 2),
            cute.group_modes(cute.local_tile(b_tma, (64, 64), (0, 0)), 0, 2))
        if tidx == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(barrier, 2 * 64 * 64 * 2)
            cute.copy(a_atom, a_gmem, a_smem, tma_bar_ptr=barrier)
            cute.copy(b_atom, b_gmem, b_smem, tma_bar_ptr=barrier)
        cute.arch.mbarrier_wait(barrier, 0)

        thread = mma.get_slice(tidx)
        c_part = thread.partition_C(cute.local_tile(c, (64, 64), (0, 0)))
        a_frag = mma.make_fragment_A(thread.partition_A(sA))
        b_frag = mma.make_fragment_B(thread.partition_B(sB))
        acc = cute.make_rmem_tensor(c_part.shape, cutlass.Float32)
        mma.set(warpgroup.Field.ACCUMULATE, False)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(a_frag, mode=[2])):
            cute.gemm(mma, acc, a_frag[None, None, k], b_frag[None, None, k], acc)
            mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        warpgroup.wait_group(0)
        cute.autovec_copy(acc, c_part)


def _vector():
    return make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16)


def _k_major(dtype):
    rows, cols = cute.sym_int(), cute.sym_int()
    return make_fake_tensor(dtype, (rows, cols), (cute.sym_int(divisibility=8), 1), assumed_align=16)


def test_kernel_report_plain_kernel(tmp_path):
    options = sass.keep_cubin_options(tmp_path / "dump")
    compiled = cute.compile(_double, _vector(), _vector(), make_fake_stream(), options=options)
    assert isinstance(compiled.__cubin__, bytes)  # the kept-cubin path
    report = sass.kernel_report(compiled)
    assert "_double_kernel" in report.kernel
    assert report.arch == "sm_90a"
    assert 0 < report.registers <= 255
    assert (report.hgmma, report.utmaldg, report.spills) == (0, 0, 0)
    assert report.local_bytes == 0 and report.static_shared_bytes == 0
    counts = sass.opcode_counts(report.sass)
    assert counts["LDG"] >= 1 and counts["STG"] >= 1 and counts["FADD"] >= 1


def test_kernel_report_tma_and_wgmma(tmp_path):
    args = (_k_major(cutlass.BFloat16), _k_major(cutlass.BFloat16), _k_major(cutlass.Float32), make_fake_stream())
    kept = cute.compile(_OneTileGemm(), *args, options=sass.keep_cubin_options(tmp_path))
    report = sass.kernel_report(kept)
    assert report.arch == "sm_90a"
    assert report.hgmma == 4  # K = 64 in steps of 16
    assert report.utmaldg == 2  # one tile of A, one of B
    assert report.spills == 0 and report.local_bytes == 0
    assert report.registers >= 32  # 64x64 FP32 accumulators over 128 threads

    # Without --keep-cubin the cubin comes out of the compiled module instead.
    plain = cute.compile(_OneTileGemm(), *args, options="--gpu-arch=sm_90a")
    assert plain.__cubin__ is None
    assert sass.kernel_cubin(plain) == sass.kernel_cubin(kept)
    assert sass.kernel_report(plain) == report


def test_kernel_report_sees_local_memory():
    compiled = cute.compile(_local_array, _vector(), _vector(), make_fake_stream(), options="--gpu-arch=sm_90a")
    report = sass.kernel_report(compiled)
    assert report.stl > 0 and report.ldl > 0
    assert report.local_bytes >= 300 * 4


def test_report_names_kernels_and_refuses_missing_code(tmp_path):
    compiled = cute.compile(_double, _vector(), _vector(), make_fake_stream(), options="--gpu-arch=sm_90a")
    cubin = sass.kernel_cubin(compiled)
    name = sass.cubin_report(cubin).kernel
    assert sass.cubin_report(cubin, name).kernel == name
    with pytest.raises(ValueError, match="no kernel 'missing'"):
        sass.cubin_report(cubin, "missing")
    with pytest.raises(ValueError, match="keep_cubin_options"):
        sass.kernel_cubin(types.SimpleNamespace(__cubin__=None, ir_module=None))
