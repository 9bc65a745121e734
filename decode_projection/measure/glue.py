"""The PDL-aware glue kernel: what comes before a projection in the benchmark's ``pdl-glue`` context.

In a model a projection follows a norm or an activation, not itself. The norms
of current inference engines launch with programmatic dependent launch (PDL):
their first action is ``griddepcontrol.wait`` (the previous kernel may still
read what they write) and at once ``griddepcontrol.launch_dependents``, so the
next kernel may launch and run its prologue while they work. This kernel does
just that, then copies ``source`` into the projection's activations ``x``; a
projection that read ``x`` before its own wait would read what was there
before (the benchmark poisons it with NaN to catch that).

``x = source``: one 16-byte vector per thread, over two contiguous 16-bit
buffers of the same size, a multiple of 8 elements, 16-byte aligned.
"""

from functools import cache

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..projection import WEIGHT_DTYPES
from ..runtime import architecture, current_stream, to_cute

VECTOR = 8  # 16-bit elements per thread: one 16-byte load and store
THREADS = 256


class PdlGlue:
    """``x = source`` over 1-D 16-bit buffers whose size is a multiple of VECTOR, launched with PDL."""

    @cute.jit
    def __call__(self, source: cute.Tensor, x: cute.Tensor, stream):
        """Launch one thread per 16-byte vector of ``source``."""
        blocks = cute.ceil_div(cute.size(source), THREADS * VECTOR)
        self.kernel(source, x).launch(grid=(blocks, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, source: cute.Tensor, x: cute.Tensor):
        """Wait for the previous kernel, let the next one launch, then copy this thread's vector."""
        cute.arch.griddepcontrol_wait()  # the previous kernel (a projection) may still read ``x``
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        vector = bidx * THREADS + tidx
        sources = cute.zipped_divide(source, (VECTOR,))
        targets = cute.zipped_divide(x, (VECTOR,))
        if vector < cute.size(sources, mode=[1]):
            targets[None, vector].store(sources[None, vector].load())


@cache
def compile_glue(dtype: torch.dtype, arch: str):
    """The glue for 16-bit ``dtype``, compiled once per architecture for every size."""
    element = WEIGHT_DTYPES[dtype]

    def fake():
        return make_fake_tensor(element, (cute.sym_int(divisibility=VECTOR),), (1,), assumed_align=16)

    return cute.compile(PdlGlue(), fake(), fake(), make_fake_stream(), options=f"--gpu-arch={arch}")


def pdl_glue(source: torch.Tensor, x: torch.Tensor):
    """``launch()``: ``x = source`` by the PDL-aware glue on the current stream (checked and converted once)."""
    if source.shape != x.shape or source.dtype != x.dtype or x.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"the glue copies between 16-bit tensors of one shape and dtype, got "
                         f"{tuple(source.shape)} {source.dtype} and {tuple(x.shape)} {x.dtype}")
    if not (source.is_contiguous() and x.is_contiguous()) or x.numel() % VECTOR:
        raise ValueError(f"the glue needs contiguous tensors of a multiple of {VECTOR} elements, got "
                         f"{tuple(x.shape)} with strides {x.stride()}")
    if x.device.type != "cuda" or source.device != x.device:
        raise ValueError(f"the glue runs on one CUDA device, got source on {source.device} and x on {x.device}")
    code = compile_glue(x.dtype, architecture(x.device))
    # The size travels as a runtime value, as the compiled signature expects (see ceiling.stream_read).
    views = [to_cute(tensor.view(-1)).mark_layout_dynamic() for tensor in (source, x)]
    device = x.device

    def launch():
        code(*views, current_stream(device))

    return launch
