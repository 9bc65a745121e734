"""Host glue between PyTorch, the CUDA driver and CuTe DSL compiled kernels.

The projection kernel is compiled once per tactic against fake tensors and then
launched many times on real ones, so everything that crosses the host/device
boundary at launch or prepare time lives here, in one place:

- ``architecture``: which GPU target a device needs; the kernel is wgmma/TMA
  code for ``sm_90a`` only, so anything but compute capability 9.0 is refused
  up front instead of failing inside the compiler or at launch.
- ``current_stream``: the caller's current torch stream as the driver handle a
  compiled function takes, so launches follow the caller's stream (and CUDA
  graph capture) without a host sync.
- ``to_cute``: an explicit torch -> CuTe tensor conversion. Handing a
  ``torch.Tensor`` straight to a compiled function goes through an adapter
  whose argument struct may silently differ from what was compiled.
- ``describe`` / ``overlaps``: the argument checks every launcher shares (a
  tensor's layout for error messages; whether two operands share a byte).
- ``compile_lock``: ``cute.compile`` is not thread-safe, so every compile in
  the package (projection, norm, activation) holds this one lock.
- ``encode_tensor_map`` / ``tensor_maps``: TMA descriptors encoded on the host
  and copied into one device buffer, because the kernel reads its weight map
  from global memory (a 128-byte, 128-byte-aligned ``CUtensorMap``).
- ``TensorMapSlots`` / ``write_tensor_map``: device slots for the descriptors of
  prepared projections, whose addresses launches on any stream and captured
  CUDA graphs keep using, so the caching allocator must never hand them out.

The glue is this package's own module (``decode_projection.runtime``, as before
the folders); its other modules are the compile cache (``disk_cache``), the
SASS reports (``sass``), the GPU's numbers (``gpu``) and sm_90's limits
(``sm90``). Layer 0 of docs/architecture.md: nothing else of decode_projection
is imported here.
"""

from __future__ import annotations

import struct
import threading
from collections import defaultdict, deque
from typing import Iterable, NamedTuple

import torch
from cuda.bindings import driver

import cutlass.cute.runtime as cute_runtime

try:  # cuda-bindings 13 loads libcuda through cuda-pathfinder, lazily
    from cuda.pathfinder import DynamicLibNotFoundError as _DriverMissing
except ImportError:  # older bindings fail at import time instead
    _DriverMissing = ()

# Hopper's wgmma and the bulk tensor copy exist only in the arch-specific
# "a" target; plain sm_90 code cannot use them.
SUPPORTED_ARCHITECTURES = {(9, 0): "sm_90a"}

# cute.compile is not thread-safe: every compile in this package holds this lock.
compile_lock = threading.Lock()

# A CUtensorMap is an opaque 128-byte object; in global memory it must sit on
# a 128-byte boundary for the kernel's descriptor fetch.
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGNMENT = 128

_DATA_TYPE = driver.CUtensorMapDataType
# Element sizes for the types whose box rules we check before calling the
# driver; packed sub-byte types are left to the driver to judge.
_ELEMENT_BYTES = {
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_UINT8: 1,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_UINT16: 2,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_UINT32: 4,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_INT32: 4,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_UINT64: 8,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_INT64: 8,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_FLOAT16: 2,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_FLOAT32: 4,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_FLOAT64: 8,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: 2,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ: 4,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_TFLOAT32: 4,
    _DATA_TYPE.CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ: 4,
}

_SWIZZLE = driver.CUtensorMapSwizzle
# With a swizzle, the box's inner extent in bytes may not exceed the swizzle
# span (CUDA driver API, cuTensorMapEncodeTiled).
_SWIZZLE_SPAN = {
    _SWIZZLE.CU_TENSOR_MAP_SWIZZLE_32B: 32,
    _SWIZZLE.CU_TENSOR_MAP_SWIZZLE_64B: 64,
    _SWIZZLE.CU_TENSOR_MAP_SWIZZLE_128B: 128,
}


_NO_CONTEXT = (
    driver.CUresult.CUDA_ERROR_NOT_INITIALIZED,
    driver.CUresult.CUDA_ERROR_INVALID_CONTEXT,
)


class TensorMapSpec(NamedTuple):
    """One tiled TMA descriptor; a plain 7-tuple in this order works as well."""

    global_address: int
    dtype: driver.CUtensorMapDataType
    dims: tuple[int, ...]  # elements per dimension, innermost first
    strides_bytes: tuple[int, ...]  # byte strides of dims[1:], rank - 1 entries
    box: tuple[int, ...]  # elements per dimension copied by one TMA
    swizzle: driver.CUtensorMapSwizzle
    l2_promotion: driver.CUtensorMapL2promotion


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


def current_stream(device) -> driver.CUstream:
    """The torch current stream of ``device`` as the ``CUstream`` a compiled function takes."""
    # Only wraps the raw handle: no synchronization, so it is safe inside a
    # CUDA graph capture, where the current stream is the capturing one.
    return driver.CUstream(torch.cuda.current_stream(device).cuda_stream)


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


def describe(tensor):
    """Shape, dtype, strides and device of a tensor, for error messages."""
    return f"{tuple(tensor.shape)} {tensor.dtype} strides {tensor.stride()} on {tensor.device}"


def overlaps(a, b):
    """Whether two 2-D tensors of unit column stride share a byte: exactly where their rows are equally pitched
    (column slices of one buffer do not overlap), else whether their byte spans intersect."""
    # Runs on every launch: each tensor property is read once (about 0.1 us apiece).
    (a_rows, a_cols), (b_rows, b_cols) = a.shape, b.shape
    a_size, b_size = a.element_size(), b.element_size()
    a0, b0 = a.data_ptr(), b.data_ptr()
    a_width, b_width = a_cols * a_size, b_cols * b_size
    a_pitch = a.stride(0) * a_size if a_rows > 1 else None
    b_pitch = b.stride(0) * b_size if b_rows > 1 else None
    a1 = a0 + (a_rows - 1) * (a_pitch or 0) + a_width
    b1 = b0 + (b_rows - 1) * (b_pitch or 0) + b_width
    if not (a0 < b1 and b0 < a1):
        return False
    pitch = a_pitch or b_pitch or max(a_width, b_width)  # a single row's pitch is never used
    if a_pitch in (None, pitch) and b_pitch in (None, pitch) and max(a_width, b_width) <= pitch:
        # Row i of a and row j of b share a byte iff -b_width < (b0 - a0) + (j - i) * pitch < a_width.
        offset = b0 - a0
        lowest = max((-b_width - offset) // pitch + 1, 1 - a_rows)
        highest = min(-((offset - a_width) // pitch) - 1, b_rows - 1)
        return lowest <= highest
    return True


def _check_spec(spec: TensorMapSpec) -> None:
    """Reject specs the driver would refuse, with a message naming the field."""
    rank = len(spec.dims)
    if not 1 <= rank <= 5:
        raise ValueError(f"tensor map rank must be 1..5, got dims {spec.dims}")
    if len(spec.box) != rank or len(spec.strides_bytes) != rank - 1:
        raise ValueError(
            f"tensor map needs {rank} box entries and {rank - 1} byte strides, "
            f"got box {spec.box} and strides {spec.strides_bytes}"
        )
    if spec.global_address % 16:
        raise ValueError(
            f"tensor map global address {spec.global_address:#x} is not 16-byte aligned"
        )
    if any(not 0 < d <= 2**32 for d in spec.dims):
        raise ValueError(f"tensor map dims must be in 1..2^32, got {spec.dims}")
    if any(s % 16 or not 0 < s < 2**40 for s in spec.strides_bytes):
        raise ValueError(
            f"tensor map strides must be positive multiples of 16 bytes below "
            f"2^40, got {spec.strides_bytes}"
        )
    if any(not 0 < b <= 256 for b in spec.box):
        raise ValueError(f"tensor map box entries must be in 1..256, got {spec.box}")
    element = _ELEMENT_BYTES.get(spec.dtype)
    if element is None:
        return
    inner = spec.box[0] * element
    if inner % 16:
        raise ValueError(
            f"tensor map box inner extent is {inner} bytes; it must be a multiple of 16"
        )
    span = _SWIZZLE_SPAN.get(spec.swizzle)
    if span is not None and inner > span:
        raise ValueError(
            f"tensor map box inner extent is {inner} bytes, more than the "
            f"{span}-byte swizzle span of {spec.swizzle.name}"
        )


def _encode(spec: TensorMapSpec):
    """One cuTensorMapEncodeTiled call: (CUresult, CUtensorMap)."""
    rank = len(spec.dims)
    return driver.cuTensorMapEncodeTiled(
        spec.dtype,
        rank,
        spec.global_address,
        [driver.cuuint64_t(d) for d in spec.dims],
        [driver.cuuint64_t(s) for s in spec.strides_bytes],
        [driver.cuuint32_t(b) for b in spec.box],
        # Unit element strides: every element of the box is loaded.
        [driver.cuuint32_t(1)] * rank,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        spec.swizzle,
        spec.l2_promotion,
        # Out-of-bounds elements read as zeros: the K tail and the rows past
        # a ragged N or batch then add nothing to the sums.
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )


def encode_tensor_map(spec) -> bytes:
    """Encode one tiled TMA descriptor on the host; returns its 128 bytes."""
    spec = TensorMapSpec(*spec)
    _check_spec(spec)
    try:
        result, tensor_map = _encode(spec)
    except _DriverMissing as error:
        # Without an NVIDIA driver the first driver call fails while loading libcuda.
        raise RuntimeError(
            "cuTensorMapEncodeTiled needs the NVIDIA driver (libcuda), which "
            f"could not be loaded here: {error}"
        ) from error
    if result in _NO_CONTEXT:
        # Encoding is host-only, yet the driver wants cuInit and a current
        # context first (measured on an H200); tensor_maps sees to both.
        raise RuntimeError(
            f"cuTensorMapEncodeTiled needs a current CUDA context ({result.name}); "
            f"use tensor_maps(), or touch the device with torch first"
        )
    if result != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled failed with {result.name} for {spec}"
        )
    # The descriptor is 16 opaque 64-bit words; the device reads them in
    # little-endian order, as the host wrote them.
    return struct.pack("<16Q", *(int(word) for word in tensor_map.opaque))


def tensor_maps(specs: Iterable, device) -> torch.Tensor:
    """Encode ``specs`` and copy them into one 128-byte-aligned device buffer.

    Returns a uint8 view whose ``data_ptr()`` is the first map; map ``i`` is at
    ``data_ptr() + 128 * i``. Keep the view alive while any kernel may read it:
    it holds the underlying allocation.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"tensor maps live in CUDA memory, got device {device}")
    specs = list(specs)
    if not specs:
        raise ValueError("tensor_maps needs at least one spec")
    size = TENSOR_MAP_BYTES * len(specs)
    with torch.cuda.device(device):
        # Allocating first also makes the device's primary context current on
        # this thread, which the driver's encoder requires.
        # The caching allocator's alignment is an implementation detail; asking
        # for 128 spare bytes and slicing makes the alignment ours to guarantee.
        buffer = torch.empty(size + TENSOR_MAP_ALIGNMENT, dtype=torch.uint8, device=device)
        blobs = [encode_tensor_map(spec) for spec in specs]
    offset = -buffer.data_ptr() % TENSOR_MAP_ALIGNMENT
    maps = buffer[offset : offset + size]
    host = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
    # A blocking copy: it runs at prepare() time, and once it returns the
    # descriptors are in place for launches on any stream, graphs included.
    maps.copy_(host)
    return maps


class TensorMapSlots:
    """128-byte, 128-byte-aligned device slots for TMA descriptors, outside the caching allocator's reuse.

    A descriptor freed to the caching allocator goes back to the stream it was allocated on and is handed out
    again at once, while launches queued on other streams (the allocator never hears of them) may still read
    it. Slots instead come from chunks that are never freed; a slot given back is handed out again only after
    a device-wide synchronize has finished every launch queued before it came back. Recording each launch's
    stream would cost every ``run`` and still miss CUDA graphs.
    """

    CHUNK_SLOTS = 256  # 32 KiB of device memory per chunk

    def __init__(self):
        self._lock = threading.Lock()
        self._chunks = []  # every chunk ever allocated, held for the life of the process
        self._free = defaultdict(list)  # device -> slots no launch can still read
        # device -> slots given back, which launches may still read. Given back from finalizers, so at any
        # moment, also while ``take`` holds the lock: a deque takes appends while it is drained, no lock needed.
        self._returned = defaultdict(deque)

    def take(self, device) -> torch.Tensor:
        """A free slot on ``device``: a uint8 view of 128 bytes whose ``data_ptr()`` is 128-byte aligned."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # as the slots' own ``device`` says
        with self._lock:
            free = self._free[device]
            if not free:
                self._refill(device, free)
            return free.pop()

    def give_back(self, slots) -> None:
        """Hand ``slots`` back; they are reused only after the device has drained the launches that read them."""
        for slot in slots:
            self._returned[slot.device].append(slot)

    def _refill(self, device, free) -> None:
        """Make free the slots given back so far, once the device is idle, else allocate a chunk."""
        returned = self._returned[device]
        if returned and not capturing():
            drained = len(returned)  # slots given back later may have launches queued after the synchronize
            torch.cuda.synchronize(device)
            free.extend(returned.popleft() for _ in range(drained))
            return
        chunk = torch.empty((self.CHUNK_SLOTS + 1) * TENSOR_MAP_BYTES, dtype=torch.uint8, device=device)
        self._chunks.append(chunk)
        # The caching allocator's alignment is an implementation detail: one spare slot makes it ours.
        start = -chunk.data_ptr() % TENSOR_MAP_ALIGNMENT
        free.extend(chunk[start + i * TENSOR_MAP_BYTES : start + (i + 1) * TENSOR_MAP_BYTES]
                    for i in reversed(range(self.CHUNK_SLOTS)))


def capturing() -> bool:
    """Whether this thread's current stream is capturing a CUDA graph (where no synchronize is allowed)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def write_tensor_map(slot: torch.Tensor, spec) -> None:
    """Encode ``spec`` into ``slot`` (from ``TensorMapSlots.take``); returns once the device holds it.

    No launch may read the slot meanwhile: the copy does not wait for other streams.
    """
    with torch.cuda.device(slot.device):
        # The encoder needs a current context, which a thread gets from its first CUDA runtime call that needs
        # one: a stream query is such a call and never waits.
        torch.cuda.current_stream(slot.device).query()
        blob = encode_tensor_map(spec)
        # A blocking copy: once it returns, launches on any stream, graphs included, read the new descriptor.
        slot.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))


# The slots of every prepared projection in this process.
tensor_map_slots = TensorMapSlots()
