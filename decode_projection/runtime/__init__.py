"""Host glue between PyTorch, the CUDA driver and CuTe DSL compiled kernels.

The projection kernel is compiled once per tactic against fake tensors and then
launched many times on real ones, so everything that crosses the host/device
boundary at launch or prepare time lives here, in one place:

- ``architecture``: which GPU target a device needs; the kernel is wgmma/TMA
  code for ``sm_90a`` only, so anything but compute capability 9.0 is refused
  up front instead of failing inside the compiler or at launch.
- ``current_stream``: the caller's current torch stream as the driver handle a
  compiled function takes (``current_stream_handle``: its number), so launches
  follow the caller's stream (and CUDA graph capture) without a host sync.
- ``to_cute``: an explicit torch -> CuTe tensor conversion. Handing a
  ``torch.Tensor`` straight to a compiled function goes through an adapter
  whose argument struct may silently differ from what was compiled.
- ``pointer`` / ``row_pitch``: an operand that changes from call to call as
  a compiled entry takes it, a pointer and its row pitch in elements (the
  entry builds its tensor; docs/host-cost.md).
- ``describe`` / ``overlaps``: the argument checks every launcher shares (a
  tensor's layout for error messages; whether two operands share a byte).
- ``compile_lock``: ``cute.compile`` is not thread-safe, so every compile in
  the package (projection, norm, activation) holds this one lock.
- ``capturing``: whether this thread's stream is capturing a CUDA graph.

The glue is this package's own module (``decode_projection.runtime``, as before
the folders); its other modules are the compile cache (``disk_cache``), the
SASS reports (``sass``), the GPU's numbers (``gpu``) and sm_90's limits
(``sm90``). Layer 0 of docs/architecture.md: nothing else of decode_projection
is imported here.
"""

from __future__ import annotations

import threading

import torch
from cuda.bindings import driver

import cutlass.cute as cute
import cutlass.cute.runtime as cute_runtime

# Hopper's wgmma and the bulk tensor copy exist only in the arch-specific
# "a" target; plain sm_90 code cannot use them.
SUPPORTED_ARCHITECTURES = {(9, 0): "sm_90a"}

# cute.compile is not thread-safe: every compile in this package holds this lock.
compile_lock = threading.Lock()


def architecture(device) -> str:
    """The CuTe DSL ``--gpu-arch`` for ``device``; only Hopper (9.0) is supported."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(
            f"decode_projection runs on CUDA devices (Hopper, sm_90a), got {device}"
        )
    capability = tuple(torch.cuda.get_device_capability(device))
    if capability not in SUPPORTED_ARCHITECTURES:
        major, minor = capability
        raise ValueError(
            f"device {device} has compute capability {major}.{minor}; the "
            f"projection kernel uses wgmma and TMA and needs sm_90a "
            f"(compute capability 9.0, H100/H200)"
        )
    return SUPPORTED_ARCHITECTURES[capability]


def current_stream_handle(device) -> int:
    """The handle of ``device``'s current torch stream."""
    # Only the raw handle: no synchronization, so it is safe inside a CUDA
    # graph capture, where the current stream is the capturing one.
    return torch.cuda.current_stream(device).cuda_stream


def current_stream(device) -> driver.CUstream:
    """The torch current stream of ``device`` as the ``CUstream`` a compiled function takes."""
    return driver.CUstream(current_stream_handle(device))


def to_cute(tensor: torch.Tensor, assumed_align: int = 16):
    """``tensor`` as a CuTe tensor via DLPack, promising the kernel ``assumed_align`` bytes."""
    # The alignment is a promise the compiled code relies on (TMA needs 16
    # bytes), so a misaligned pointer is refused here rather than turned into
    # a misaligned-address fault or wrong data on the GPU.
    if tensor.data_ptr() % assumed_align:
        raise ValueError(
            f"tensor data pointer {tensor.data_ptr():#x} is not {assumed_align}-byte aligned "
            f"(shape {tuple(tensor.shape)}, dtype {tensor.dtype})"
        )
    return cute_runtime.from_dlpack(tensor, assumed_align=assumed_align)


def pointer(dtype, address: int, align: int | None = None):
    """A global-memory pointer of CuTe type ``dtype``, promising ``align`` bytes (default: the element's)."""
    return cute_runtime.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align or dtype.width // 8)


def row_pitch(tensor) -> int:
    """The row pitch, in elements, a kernel takes for a 2-D ``tensor``: its stride, except for a single row,
    whose pitch is never used and for which PyTorch may report any stride (then the row rounded up to 8)."""
    rows, cols = tensor.shape
    return tensor.stride(0) if rows > 1 else -(-cols // 8) * 8


def describe(tensor):
    """Shape, dtype, strides and device of a tensor, for error messages."""
    return f"{tuple(tensor.shape)} {tensor.dtype} strides {tensor.stride()} on {tensor.device}"


def byte_rows(tensor) -> tuple:
    """The bytes a 2-D tensor of unit column stride (or a contiguous 1-D one, as a single row) covers: its first
    byte, one past its last, its rows, their pitch in bytes (None for a single row, whose pitch is never used) and
    each row's width in bytes. A plain tuple: it is built for every operand of every launch."""
    # Each tensor property is read once (about 0.1 us apiece).
    start, size = tensor.data_ptr(), tensor.element_size()
    if tensor.dim() == 1:
        width = tensor.shape[0] * size
        return start, start + width, 1, None, width
    rows, cols = tensor.shape
    width = cols * size
    if rows <= 1:
        return start, start + width, rows, None, width
    pitch = tensor.stride(0) * size
    return start, start + (rows - 1) * pitch + width, rows, pitch, width


def rows_overlap(a: tuple, b: tuple) -> bool:
    """Whether two ``byte_rows`` share a byte: exactly where their rows are equally pitched (column slices of one
    buffer do not overlap), else whether their byte spans intersect."""
    a0, a1, a_rows, a_pitch, a_width = a
    b0, b1, b_rows, b_pitch, b_width = b
    if not (a0 < b1 and b0 < a1):
        return False
    pitch = a_pitch or b_pitch or max(a_width, b_width)
    if a_pitch in (None, pitch) and b_pitch in (None, pitch) and max(a_width, b_width) <= pitch:
        # Row i of a and row j of b share a byte iff -b_width < (b0 - a0) + (j - i) * pitch < a_width.
        offset = b0 - a0
        lowest = max((-b_width - offset) // pitch + 1, 1 - a_rows)
        highest = min(-((offset - a_width) // pitch) - 1, b_rows - 1)
        return lowest <= highest
    return True


def overlaps(tensor, *others) -> bool:
    """Whether ``tensor`` shares a byte with any of ``others`` (tensors as ``byte_rows`` takes them)."""
    mine = byte_rows(tensor)
    for other in others:
        if rows_overlap(mine, byte_rows(other)):
            return True
    return False


def capturing() -> bool:
    """Whether this thread's current stream is capturing a CUDA graph (where no synchronize is allowed)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
