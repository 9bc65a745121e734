"""The streaming-read ceiling: how fast this GPU reads a weight once, measured, not quoted.

A decode projection cannot beat reading its weight once. The datasheet HBM
figure (4.8 TB/s on an H200) is not reached by real kernels, and a
device-to-device copy both reads and writes; so the benchmark times this
read-only kernel over the same bytes in the same run. Each CTA streams a
contiguous slice of the buffer into shared memory with 1-D bulk copies
(``cp.async.bulk``, the TMA engine without a tensor map), ``STAGES`` chunks
deep, and does nothing with the data: what is left is launch, latency and
bandwidth.
"""

from functools import cache

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
from cutlass.experimental.primitives import nvvm_wrapper as nvvm

from ..kernel.splitk import EVICT_FIRST
from ..runtime import architecture, current_stream, to_cute

CHUNK_BYTES = 16 * 1024
STAGES = 12  # 192 KB in flight per SM


class StreamRead:
    """Read a 16-byte aligned byte buffer (size a multiple of 16) once, one CTA per slice."""

    @cute.jit
    def __call__(self, data: cute.Tensor, ctas: cutlass.Int32, stream):
        """Launch ``ctas`` one-warp CTAs, each reading its slice of ``data``."""
        @cute.struct
        class SharedStorage:
            barriers: cute.struct.MemRange[cutlass.Int64, STAGES]
            chunks: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, STAGES * CHUNK_BYTES], 128]

        self.shared_storage = SharedStorage
        self.kernel(data).launch(grid=(ctas, 1, 1), block=(32, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, data: cute.Tensor):
        """Pull this CTA's chunks through a ring of bulk copies into shared memory, and discard them."""
        self.stream(data)

    @cute.jit
    def stream(self, data: cute.Tensor):
        """The kernel's work, apart so that a probe's kernel can stamp times around it."""
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        barriers = storage.barriers.data_ptr()
        total = data.shape[0]
        chunks = cute.ceil_div(total, CHUNK_BYTES)
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        per_cta = cute.ceil_div(chunks, ctas)
        first = cta * per_cta
        count = cutlass.max(cutlass.min(per_cta, chunks - first), 0)
        if nvvm.elect_sync():
            for s in cutlass.range_constexpr(STAGES):
                cute.arch.mbarrier_init(barriers + s, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_warp()
        for i in cutlass.range(cutlass.min(STAGES, count), unroll=1):
            self.issue(storage, data, first + i, i % STAGES, total)
        for i in cutlass.range(count, unroll=1):
            self.wait_chunk(storage, i, count)
            if i + STAGES < count:
                self.issue(storage, data, first + i + STAGES, i % STAGES, total)

    @cute.jit
    def wait_chunk(self, storage, i, count):
        """Wait until the ``i``-th of this CTA's ``count`` chunks has landed."""
        cute.arch.mbarrier_wait(storage.barriers.data_ptr() + i % STAGES, (i // STAGES) % 2)

    @cute.jit
    def issue(self, storage, data, chunk, slot, total):
        """Start the bulk copy of one chunk into its slot."""
        size = cutlass.min(CHUNK_BYTES, total - chunk * CHUNK_BYTES)
        barrier = storage.barriers.data_ptr() + slot
        if nvvm.elect_sync():
            cute.arch.mbarrier_arrive_and_expect_tx(barrier, size)
            nvvm.cp_async_bulk_shared_cluster_global(
                storage.chunks.data_ptr() + slot * CHUNK_BYTES,
                data.iterator + chunk * CHUNK_BYTES,
                barrier,
                size,
                l2_cache_hint=EVICT_FIRST,
            )


def fake_bytes():
    """The compile-time stand-in of the buffer ``byte_view`` gives: 16-byte aligned bytes of a runtime size."""
    return make_fake_tensor(cutlass.Uint8, (cute.sym_int(divisibility=16),), (1,), assumed_align=16)


def byte_view(tensor: torch.Tensor) -> cute.Tensor:
    """A contiguous tensor's bytes as the kernel's ``data``. The size must travel as a runtime value: a
    static-shape view would not match the compiled signature, and the kernel would read a wrong size."""
    return to_cute(tensor.view(torch.uint8).reshape(-1)).mark_layout_dynamic()


@cache
def compile_stream_read(arch: str):
    """The read-only kernel, compiled once per architecture."""
    return cute.compile(StreamRead(), fake_bytes(), cutlass.Int32(1), make_fake_stream(), options=f"--gpu-arch={arch}")


def stream_read(weight: torch.Tensor) -> None:
    """Read every byte of a contiguous CUDA tensor once, on the current stream."""
    if not weight.is_contiguous() or (weight.numel() * weight.element_size()) % 16:
        raise ValueError("stream_read needs a contiguous tensor whose size is a multiple of 16 bytes")
    code = compile_stream_read(architecture(weight.device))
    ctas = torch.cuda.get_device_properties(weight.device).multi_processor_count
    code(byte_view(weight), cutlass.Int32(ctas), current_stream(weight.device))
