"""Prepared split-K projections: ``out = x @ weight^T`` for padded decode batches.

A projection is prepared once per weight: every padded batch in its policy
table gets compiled code (from a cache keyed on code only, so every weight of
every shape shares it) and the weight's TMA descriptor for that tactic's tile
height, stored in device memory next to the weight. ``run`` then validates its
arguments on the host and launches; it allocates nothing, never synchronizes
and can be captured in a CUDA graph.
"""

import threading
from functools import cache

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
from torch.autograd.graph import increment_version

from .disk_cache import cached_compile
from .gpu import gpu_spec
from .policies import resolve_policies
from .runtime import architecture, current_stream, tensor_maps, to_cute
from .splitk import SplitKGemm
from .tactic import BOX_K, as_tactic

WEIGHT_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}
OUTPUT_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float32: cutlass.Float32}
TMA_ALIGN = 16  # bytes: TMA base address and row pitch granularity
MOST_GRID_ROWS = 65535  # CUDA's limit on a grid's y dimension

# cute.compile is not thread-safe.
_compile_lock = threading.Lock()


def compile_projection(tactic, output_dtype, arch, weight_dtype=torch.bfloat16, programmatic_launch=True):
    """Code-only cache; weights, descriptors and activation pointers stay private.

    Backed by the persistent cache of ``disk_cache``, so a restart loads instead of compiling.
    ``programmatic_launch`` launches with programmatic dependent launch (SplitKGemm).
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"projection weight dtype must be one of {list(WEIGHT_DTYPES)}, got {weight_dtype}")
    check_launch_options(output_dtype, programmatic_launch)
    return _compile(as_tactic(tactic), output_dtype, arch, weight_dtype, programmatic_launch)


def check_launch_options(output_dtype, programmatic_launch):
    """Raise a ValueError/TypeError unless the kernel writes ``output_dtype`` and ``programmatic_launch`` is a bool."""
    if output_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"unsupported projection output dtype {output_dtype}")
    if not isinstance(programmatic_launch, bool):
        raise TypeError(f"programmatic_launch must be a bool, got {programmatic_launch!r}")


def kernel_arguments(weight_dtype, output_dtype) -> tuple:
    """The symbolic arguments every projection kernel is compiled for: weight, activations, output, map, stream."""
    operand = WEIGHT_DTYPES[weight_dtype]

    def fake(dtype, *, output):
        # Extents and the row pitch are runtime symbols: one kernel serves every
        # weight, batch and buffer. TMA operands promise 16-byte pitches.
        shape = tuple(cute.sym_int() for _ in range(3))
        pitch = cute.sym_int64(divisibility=1 if output else TMA_ALIGN // 2)
        stride = (1, pitch, 0) if output else (pitch, 1, 0)
        # The output is written with plain stores: element alignment is enough.
        align = dtype.width // 8 if output else TMA_ALIGN
        return make_fake_tensor(dtype, shape, stride, assumed_align=align)

    return (
        fake(operand, output=False),
        fake(operand, output=False),
        fake(OUTPUT_DTYPES[output_dtype], output=True),
        cutlass.Int64(0),
        make_fake_stream(),
    )


@cache
def _compile(tactic, output_dtype, arch, weight_dtype, programmatic_launch):
    """compile_projection on normalized arguments (a tuple and its SplitKTactic share one entry)."""

    def build():
        return cute.compile(SplitKGemm(tactic, programmatic_launch), *kernel_arguments(weight_dtype, output_dtype),
                            options=f"--gpu-arch={arch}")

    with _compile_lock:
        return cached_compile(build, tactic, str(output_dtype), str(weight_dtype), arch, programmatic_launch)


# The in-memory cache, inspectable and clearable through the public function.
compile_projection.cache_info = _compile.cache_info
compile_projection.cache_clear = _compile.cache_clear


def matrix_view(tensor, *, output=False):
    """Keep packed row pitches and a singleton-safe dynamic major axis.

    Operands are viewed as (rows, cols, 1) K-major; the output as (cols, rows, 1),
    the transposed view the swapped-AB kernel writes. The major axis is named
    explicitly because a batch of 1 has a size-1 dimension whose stride PyTorch
    reports as 1, which would defeat leading-dimension deduction.
    """
    rows, cols = tensor.shape
    # A single row's pitch is never used, and PyTorch may report any stride there.
    pitch = tensor.stride(0) if rows > 1 else -(-cols // 8) * 8
    shape = (cols, rows, 1) if output else (rows, cols, 1)
    stride = (1, pitch, 0) if output else (pitch, 1, 0)
    align = tensor.element_size() if output else TMA_ALIGN
    if tensor.requires_grad:  # DLPack refuses these; the kernel never takes part in autograd
        tensor = tensor.detach()
    result = to_cute(tensor.as_strided(shape, stride), assumed_align=align)
    return result.mark_layout_dynamic(leading_dim=0 if output else 1)


def weight_map(weight, rows, l2_promotion=cuda.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B):
    """Device TMA map of ``weight`` [N, K] (row pitch kept): box {64, rows}, SW128, L2 promotion 128 B by default."""
    # 128 B, not 256 B: each box row is exactly 128 B, and the wider promotion streamed 2-8% slower
    # on the H200 with the same DRAM bytes (docs/measurements/2026-12-02-l2-promotion-h200.txt).
    check_weight(weight)
    types = cuda.CUtensorMapDataType
    dtype = {
        torch.bfloat16: types.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        torch.float16: types.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    }[weight.dtype]
    swizzle = cuda.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    n, k = weight.shape
    # A single row's pitch is never used, and PyTorch may report any stride there.
    pitch = weight.stride(0) * weight.element_size() if n > 1 else -(-k // 8) * 16
    spec = (weight.data_ptr(), dtype, (k, n), (pitch,), (BOX_K, rows), swizzle, l2_promotion)
    return tensor_maps([spec], weight.device)


# A compiled function loads its module on the device current at its first call
# and stays bound to it (CuTe DSL 4.8.1); one kernel on two GPUs would launch in
# the wrong context. Multi-GPU processes are refused until each device gets its
# own executor.
_kernel_devices = {}


def _claim_device(code, device):
    """Bind a compiled kernel to one device; refuse a second."""
    bound = _kernel_devices.setdefault(id(code), (code, device))[1]
    if bound != device:
        raise ValueError(
            f"this kernel already runs on {bound}; projections on several GPUs in one process "
            f"are not supported yet (weight on {device})"
        )


def _describe(tensor):
    """Shape, dtype, strides and device of a tensor, for error messages."""
    return f"{tuple(tensor.shape)} {tensor.dtype} strides {tensor.stride()} on {tensor.device}"


def check_weight(weight):
    """Raise a TypeError/ValueError naming whatever about ``weight`` the kernel cannot take."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"projection weight must be a torch.Tensor, got {type(weight)}")
    if weight.dim() != 2 or weight.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"projection weight must be a BF16/FP16 [N, K] matrix, got {tuple(weight.shape)} {weight.dtype}")
    if weight.is_neg():
        raise ValueError("projection weight is a negated view; resolve it first (tensor.resolve_neg())")
    pitch = weight.stride(0) * weight.element_size() if weight.shape[0] > 1 else 0
    if weight.stride(1) != 1 or pitch % TMA_ALIGN or weight.data_ptr() % TMA_ALIGN:
        raise ValueError(f"projection weight rows need unit stride and a 16 B TMA pitch, got {_describe(weight)}")
    if min(weight.shape) == 0:
        raise ValueError(f"projection weight is empty: {_describe(weight)}")
    if weight.shape[0] > 1 and weight.stride(0) < weight.shape[1]:
        raise ValueError(f"projection weight rows overlap (an expanded or strided view?): {_describe(weight)}")
    if weight.shape[1] % 8 or max(weight.shape) >= 2**31:
        raise ValueError(f"projection weight needs K % 8 == 0 and N, K < 2^31, got {_describe(weight)}")


def _overlaps(a, b):
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


class PreparedProjection:
    """Split-K projection with a per-batch tactic table and caller-owned outputs.

    ``programmatic_launch`` (default True) launches with programmatic dependent
    launch: the weight streams while the previous kernel finishes, which pays
    where that kernel triggers its dependents early (another projection does).
    After a kernel that never does, as PyTorch's do not, False measured
    0.14-0.53 us faster per launch on the H200 (docs/performance.md, v20).
    With it, the first weight stages load before the kernel waits on the
    previous one, which only the activations and the output depend on: a kernel
    that writes the weight and triggers its dependents early must not come just
    before ``run`` (launch with ``programmatic_launch=False`` there). The
    weight's TMA descriptors live in device memory owned by this object: keep
    it alive until the launches that use it have finished.
    """

    def __init__(self, weight, policies, *, output_dtype=torch.bfloat16, programmatic_launch=True):
        self.weight, self.output_dtype, self.programmatic_launch = weight, output_dtype, programmatic_launch
        self.policies = policies
        self._validate()
        self.device = weight.device
        self.kernels, self.extra, self.maps = {}, {}, {}
        self.policy_sources = dict.fromkeys(self.policies, "given")
        self._prepared_storage = None

    def _validate(self):
        """Raise unless the kernel takes the weight, output dtype, launch flag and policies; ``policies`` become
        ``{batch: SplitKTactic}``. Run again by ``prepare``: any of them may have been replaced since."""
        check_weight(self.weight)
        check_launch_options(self.output_dtype, self.programmatic_launch)
        policies = {}
        for batch, tactic in dict(self.policies).items():
            if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
                raise ValueError(f"policy batch must be a positive int, got {batch!r}")
            tactic = as_tactic(tactic)
            m_tiles = tactic.grid_rows(batch)
            if m_tiles > MOST_GRID_ROWS:
                raise ValueError(f"policy batch {batch} needs {m_tiles} activation tiles of {tactic.activation_rows} "
                                 f"rows, more than a launch's {MOST_GRID_ROWS}")
            policies[batch] = tactic
        self.policies = policies

    @classmethod
    def for_weight(cls, weight, batches=(1, 2, 4, 8, 16, 32, 64), *, output_dtype=torch.bfloat16,
                   batch_invariant=False, programmatic_launch=True):
        """A prepared projection whose tactics come from a shipped table for this GPU, else the heuristic.

        ``policy_sources`` says, per batch, which one was used. The tables were tuned with
        programmatic launch, timed both back to back and after a foreign kernel.
        """
        check_weight(weight)
        architecture(weight.device)
        n, k = weight.shape
        policies, sources = resolve_policies(
            n, k, batches, gpu=gpu_spec(weight.device), weight_dtype=weight.dtype,
            output_dtype=output_dtype, batch_invariant=batch_invariant,
        )
        projection = cls(weight, policies, output_dtype=output_dtype, programmatic_launch=programmatic_launch)
        projection.policy_sources = sources
        return projection.prepare()

    def prepare(self):
        """Compile (or fetch) each batch's kernel and build the weight's device TMA maps, all or nothing.

        A re-prepare (after ``weight`` or ``policies`` changed) checks them as the constructor does and replaces
        every kernel and map; CUDA graphs captured before it hold the old maps' addresses and must be captured again.
        """
        # Until this prepare completes, run() refuses: the kernels and maps of an earlier one must never
        # launch with descriptors this one frees, nor for batches it no longer holds.
        self._prepared_storage = None
        self._validate()
        if self.maps:
            # Launches on any stream may still read the old descriptors; the caching allocator would hand
            # their memory to the next allocation on the stream they were made on.
            torch.cuda.synchronize(self.device)
        self.kernels, self.extra, self.maps = {}, {}, {}
        self.device = self.weight.device
        arch, dtype = architecture(self.device), self.output_dtype
        kernels, extra = {}, {}
        with torch.cuda.device(self.device):
            for batch, tactic in self.policies.items():
                tactic = as_tactic(tactic)
                code = compile_projection(tactic, dtype, arch, self.weight.dtype, self.programmatic_launch)
                _claim_device(code, self.device)
                kernels[batch] = code
                extra[batch] = self.weight_map(tactic.weight_load_rows)
        self.kernels, self.extra = kernels, extra
        self.weight_view = matrix_view(self.weight)
        self._prepared_storage = self._storage(self.weight)
        return self

    def weight_map(self, rows):
        """The kernel's extra argument: the weight's map for loads of ``rows`` rows."""
        if rows not in self.maps:
            self.maps[rows] = weight_map(self.weight, rows)
        return (cutlass.Int64(self.maps[rows].data_ptr()),)

    @staticmethod
    def _storage(weight):
        """What the prepared descriptors baked in about the weight."""
        return (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype, weight.device)

    def _check(self, x, out):
        """Raise a TypeError/ValueError naming whatever about x or out the kernel cannot take."""
        for name, tensor in (("input", x), ("output", out)):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"projection {name} must be a torch.Tensor, got {type(tensor)}")
            if tensor.dim() != 2:
                raise ValueError(f"projection {name} must be 2-D, got {_describe(tensor)}")
            if tensor.device != self.device:
                raise ValueError(
                    f"projection {name} is on {tensor.device}, the weight on {self.device}"
                )
            if tensor.stride(1) != 1:
                raise ValueError(f"projection {name} rows need unit stride, got {_describe(tensor)}")
            if tensor.is_neg():
                # A lazily negated view: the kernel reads and writes its storage as is.
                raise ValueError(f"projection {name} is a negated view; resolve it first (tensor.resolve_neg())")
        if self._prepared_storage is None:
            raise ValueError("projection is not prepared: call prepare() first")
        if self._storage(self.weight) != self._prepared_storage:
            raise ValueError(
                "projection weight storage changed after prepare(): "
                f"{_describe(self.weight)}; prepare a new projection"
            )
        n, k = self.weight.shape
        batch, x_cols = x.shape
        if batch not in self.kernels or x_cols != k:
            raise ValueError(
                f"projection input {tuple(x.shape)}: prepared batches "
                f"{sorted(self.kernels)}, K {k}"
            )
        if x.dtype != self.weight.dtype:
            raise ValueError(f"projection input dtype {x.dtype} != weight dtype {self.weight.dtype}")
        x_stride = x.stride(0) if batch > 1 else 0
        if x_stride * x.element_size() % TMA_ALIGN or x.data_ptr() % TMA_ALIGN:
            raise ValueError(
                f"projection input needs a 16 B aligned base and row pitch, got {_describe(x)}"
            )
        if batch > 1 and x_stride < k:
            raise ValueError(f"projection input rows overlap: {_describe(x)}")
        if batch >= 2**31:
            raise ValueError(f"projection batch must be below 2^31, got {_describe(x)}")
        if out.requires_grad and torch.is_grad_enabled():
            raise ValueError("projection output requires grad: the kernel writes it outside autograd "
                             "(pass one that does not, or run under torch.no_grad())")
        if out.dtype != self.output_dtype:
            raise ValueError(f"projection output dtype {out.dtype} != {self.output_dtype}")
        if tuple(out.shape) != (batch, n):
            raise ValueError(f"projection output must be {(batch, n)}, got {_describe(out)}")
        if out.stride(0) < n and batch > 1:
            raise ValueError(f"projection output rows overlap: {_describe(out)}")
        if _overlaps(out, x) or _overlaps(out, self.weight):
            raise ValueError("projection output overlaps its input or weight")

    def run(self, x, out):
        """Launch ``out = x @ weight^T`` on the weight device's current stream; returns ``out``."""
        self._check(x, out)
        batch = x.shape[0]
        code, extra = self.kernels[batch], self.extra[batch]
        args = (self.weight_view, matrix_view(x), matrix_view(out, output=True), *extra, current_stream(self.device))
        if torch.cuda.current_device() == self.device.index:
            code(*args)
        else:
            with torch.cuda.device(self.device):
                code(*args)
        # An in-place write autograd cannot see: a backward that saved ``out`` before this now fails loudly.
        increment_version(out)
        return out
