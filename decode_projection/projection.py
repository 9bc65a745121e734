"""Prepared split-K projections: ``out = x @ weight^T`` for padded decode batches.

A projection is prepared once per weight: every padded batch in its policy
table gets compiled code (from a cache keyed on code only, so every weight of
every shape shares it). ``run`` then validates its arguments on the host and
launches, the weight's TMA descriptor for that tactic's tile height encoded
and passed by value; it allocates nothing, never synchronizes and can be
captured in a CUDA graph.
"""

import logging
import threading
from functools import cache
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cuda.bindings import driver
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
from torch.autograd.graph import increment_version

from .kernel.launch import EXTENT_TYPES, VALUE_KINDS, LaunchValues, SplitKLaunch, tma_pitch_multiple
from .kernel.splitk import SplitKGemm
from .kernel.tactic import GATE_GROUP_ROWS, as_tactic, gated_problems
from .policy.policies import gated_tactic, resolve_policies
from .policy.tables import dtype_name
from .runtime import (
    architecture, byte_rows, capturing, compile_lock, current_stream_handle, describe, overlaps, pointer, row_pitch,
    rows_overlap, to_cute,
)
from .runtime.call_slots import CallSlots
from .runtime.disk_cache import cached_compile
from .runtime.gpu import gpu_spec
from .runtime.sm90 import TMA_ALIGN

logger = logging.getLogger(__name__)

WEIGHT_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}
OUTPUT_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16, torch.float32: cutlass.Float32}
BIAS_DTYPES = OUTPUT_DTYPES
MOST_GRID_ROWS = 65535  # CUDA's limit on a grid's y dimension
MOST_GRID_COLUMNS = 2**31 - 1  # and on its x dimension


class Epilogue(NamedTuple):
    """What a kernel makes of ``x @ weight^T`` in FP32 before its one rounding: adds a residual laid out as the
    output (``run(x, out, residual=r)``) and a bias of one value per weight row of ``bias_dtype`` (None: no bias);
    or, ``gated``, writes ``silu(gate) * up`` of a gate/up interleaved weight (``interleave_gate_up``)."""

    residual: bool = False
    bias_dtype: torch.dtype | None = None
    gated: bool = False


NO_EPILOGUE = Epilogue()


def compile_projection(tactic, output_dtype, arch, weight_dtype=torch.bfloat16, programmatic_launch=True,
                       epilogue=NO_EPILOGUE):
    """Code-only cache; weights, descriptors and activation pointers stay private.

    Backed by the persistent cache of ``disk_cache``, so a restart loads instead of compiling.
    ``programmatic_launch`` launches with programmatic dependent launch (SplitKGemm).
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"projection weight dtype must be one of {list(WEIGHT_DTYPES)}, got {weight_dtype}")
    check_launch_options(output_dtype, programmatic_launch)
    check_epilogue(epilogue)
    return _compile(as_tactic(tactic), output_dtype, arch, weight_dtype, programmatic_launch, epilogue)


def check_epilogue(epilogue):
    """Raise a TypeError/ValueError unless ``epilogue`` is an Epilogue the kernel can add."""
    if not isinstance(epilogue, Epilogue) or not all(isinstance(flag, bool) for flag in (epilogue.residual,
                                                                                           epilogue.gated)):
        raise TypeError(f"epilogue must be an Epilogue(residual: bool, bias_dtype, gated: bool), got {epilogue!r}")
    if epilogue.bias_dtype is not None and epilogue.bias_dtype not in BIAS_DTYPES:
        raise ValueError(f"projection bias dtype must be one of {list(BIAS_DTYPES)}, got {epilogue.bias_dtype}")
    if epilogue.gated and (epilogue.residual or epilogue.bias_dtype is not None):
        raise ValueError("a gated projection writes silu(gate) * up: it takes no bias or residual")


def check_launch_options(output_dtype, programmatic_launch):
    """Raise a ValueError/TypeError unless the kernel writes ``output_dtype`` and ``programmatic_launch`` is a bool."""
    if output_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"unsupported projection output dtype {output_dtype}")
    if not isinstance(programmatic_launch, bool):
        raise TypeError(f"programmatic_launch must be a bool, got {programmatic_launch!r}")


def kernel_arguments(weight_dtype, output_dtype, epilogue=NO_EPILOGUE) -> tuple:
    """The symbolic arguments every projection kernel is compiled for, in ``SplitKLaunch``'s order: the weight, the
    bias vector (or None), then ``LaunchValues``."""
    operand, output = WEIGHT_DTYPES[weight_dtype], OUTPUT_DTYPES[output_dtype]
    # Extents and the row pitch are runtime symbols: one kernel serves every weight. TMA needs 16-byte pitches.
    weight = make_fake_tensor(operand, tuple(cute.sym_int() for _ in range(3)),
                              (cute.sym_int64(divisibility=tma_pitch_multiple(operand)), 1, 0), assumed_align=TMA_ALIGN)
    bias = None
    if epilogue.bias_dtype is not None:
        dtype = BIAS_DTYPES[epilogue.bias_dtype]
        bias = make_fake_tensor(dtype, (cute.sym_int(),), (1,), assumed_align=dtype.width // 8)
    values = LaunchValues(0, 0, 0 if epilogue.residual else None, *(kind(1) for kind in EXTENT_TYPES),
                          make_fake_stream())
    return (weight, bias, *dsl_pointers(values, operand, output))


def dsl_pointers(values: LaunchValues, operand, output) -> LaunchValues:
    """``values`` with its three addresses as the pointers the kernel is compiled for: the activations' promising
    TMA's 16 bytes, the output's and the residual's their element's (they are written with plain stores)."""
    return values._replace(activations=pointer(operand, values.activations, TMA_ALIGN),
                           out=pointer(output, values.out),
                           residual=None if values.residual is None else pointer(output, values.residual))


def compile_kernel(tactic, output_dtype, weight_dtype=torch.bfloat16, programmatic_launch=True,
                   epilogue=NO_EPILOGUE, options="--gpu-arch=sm_90a"):
    """``cute.compile`` of one projection kernel, uncached: what ``compile_projection`` caches."""
    gemm = SplitKGemm(tactic, programmatic_launch, gated=epilogue.gated)
    return cute.compile(SplitKLaunch(gemm), *kernel_arguments(weight_dtype, output_dtype, epilogue), options=options)


@cache
def _compile(tactic, output_dtype, arch, weight_dtype, programmatic_launch, epilogue=NO_EPILOGUE):
    """compile_projection on normalized arguments (a tuple and its SplitKTactic share one entry)."""

    def build():
        logger.debug("compiling %s for %s: %s weights, %s output, %s", tactic, arch, weight_dtype, output_dtype,
                     epilogue)
        return compile_kernel(tactic, output_dtype, weight_dtype, programmatic_launch, epilogue,
                              options=f"--gpu-arch={arch}")

    # Without an epilogue the key is what it always was: caches filled before epilogues existed still load.
    epilogue_key = () if epilogue == NO_EPILOGUE else (str(epilogue),)
    with compile_lock:
        return cached_compile(build, tactic, str(output_dtype), str(weight_dtype), arch, programmatic_launch,
                              *epilogue_key)


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
    pitch = row_pitch(tensor)
    shape = (cols, rows, 1) if output else (rows, cols, 1)
    stride = (1, pitch, 0) if output else (pitch, 1, 0)
    align = tensor.element_size() if output else TMA_ALIGN
    if tensor.requires_grad:  # DLPack refuses these; the kernel never takes part in autograd
        tensor = tensor.detach()
    result = to_cute(tensor.as_strided(shape, stride), assumed_align=align)
    return result.mark_layout_dynamic(leading_dim=0 if output else 1)


def launch_values(x, out, residual, output_rows, device) -> LaunchValues:
    """One launch's ``LaunchValues``: ``x``, ``out`` and ``residual`` (or None) as checked torch tensors, on
    ``device``'s current stream."""
    return LaunchValues(x.data_ptr(), out.data_ptr(), None if residual is None else residual.data_ptr(), x.shape[0],
                        output_rows, row_pitch(x), row_pitch(out), 0 if residual is None else row_pitch(residual),
                        current_stream_handle(device))


def launch_value_kinds(epilogue) -> LaunchValues:
    """The C type of each ``LaunchValues`` the kernels of ``epilogue`` take (None for the residual they lack)."""
    return VALUE_KINDS if epilogue.residual else VALUE_KINDS._replace(residual=None)


def launch_arguments(weight_view, bias_view, values: LaunchValues, weight_dtype, output_dtype) -> tuple:
    """A compiled projection's whole argument list in the DSL's types: ``weight_view`` and ``bias_view`` as
    prepared, then ``values`` as pointers, integers and a stream."""
    values = dsl_pointers(values, WEIGHT_DTYPES[weight_dtype], OUTPUT_DTYPES[output_dtype])
    return (weight_view, bias_view, *values._replace(stream=driver.CUstream(values.stream)))


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


def check_weight(weight):
    """Raise a TypeError/ValueError naming whatever about ``weight`` the kernel cannot take."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"projection weight must be a torch.Tensor, got {type(weight)}")
    if weight.dim() != 2 or weight.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"projection weight must be a BF16/FP16 [N, K] matrix, got {tuple(weight.shape)} {weight.dtype}")
    if weight.is_neg():
        raise ValueError("projection weight is a negated view; resolve it first (tensor.resolve_neg())")
    if min(weight.shape) == 0:  # before the pitch: PyTorch gives an empty tensor whatever strides it likes
        raise ValueError(f"projection weight is empty: {describe(weight)}")
    pitch = weight.stride(0) * weight.element_size() if weight.shape[0] > 1 else 0
    if weight.stride(1) != 1 or pitch % TMA_ALIGN or weight.data_ptr() % TMA_ALIGN:
        raise ValueError(f"projection weight rows need unit stride and a 16 B TMA pitch, got {describe(weight)}")
    if weight.shape[0] > 1 and weight.stride(0) < weight.shape[1]:
        raise ValueError(f"projection weight rows overlap (an expanded or strided view?): {describe(weight)}")
    if weight.shape[1] % 8 or max(weight.shape) >= 2**31:
        raise ValueError(f"projection weight needs K % 8 == 0 and N, K < 2^31, got {describe(weight)}")


def check_bias(bias, weight):
    """Raise a TypeError/ValueError unless ``bias`` is None or an ``[N]`` vector the kernel can read for ``weight``."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"projection bias must be a torch.Tensor or None, got {type(bias)}")
    if bias.dim() != 1 or bias.shape[0] != weight.shape[0] or bias.dtype not in BIAS_DTYPES:
        raise ValueError(f"projection bias must be a [{weight.shape[0]}] vector of {list(BIAS_DTYPES)}, "
                         f"got {describe(bias)}")
    if bias.device != weight.device:
        raise ValueError(f"projection bias is on {bias.device}, the weight on {weight.device}")
    if bias.stride(0) != 1 and bias.shape[0] > 1:
        raise ValueError(f"projection bias needs unit stride, got {describe(bias)}")
    if bias.is_neg() or bias.is_conj():
        raise ValueError("projection bias is a lazily negated view; resolve it first (tensor.resolve_neg())")


def check_residual(residual, out, x, weight):
    """Raise a TypeError/ValueError unless the kernel can read ``residual`` while it writes ``out``: ``out``'s shape
    and dtype, unit stride along N, and either ``out`` itself (the same elements) or apart from it, from ``x`` and
    from the weight."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"projection residual must be a torch.Tensor, got {type(residual)}")
    if residual.shape != out.shape or residual.dtype != out.dtype:
        raise ValueError(f"projection residual must be shaped and typed as the output {describe(out)}, "
                         f"got {describe(residual)}")
    if residual.device != out.device:
        raise ValueError(f"projection residual is on {residual.device}, the output on {out.device}")
    if residual.stride(1) != 1 and residual.shape[1] > 1:
        raise ValueError(f"projection residual rows need unit stride, got {describe(residual)}")
    if residual.shape[0] > 1 and residual.stride(0) < residual.shape[1]:
        raise ValueError(f"projection residual rows overlap: {describe(residual)}")
    if residual.is_neg():
        raise ValueError("projection residual is a negated view; resolve it first (tensor.resolve_neg())")
    if residual.requires_grad and torch.is_grad_enabled():
        raise ValueError("projection residual requires grad, and autograd does not flow through run(): detach it "
                         "or run under torch.no_grad()")
    # Each output is read and written by one thread: in place is safe, any other overlap with out is a race.
    residual_bytes, out_bytes = byte_rows(residual), byte_rows(out)
    if residual_bytes != out_bytes and rows_overlap(residual_bytes, out_bytes):
        raise ValueError("projection residual overlaps the output without being it (in place, pass out itself)")
    if overlaps(residual, x, weight):
        raise ValueError("projection residual overlaps its input or weight")


def interleave_gate_up(gate, up):
    """``[2 * ceil(N / 8) * 8, K]``: eight rows of ``gate`` then the same eight rows of ``up``, in turn (the last
    group padded with zero rows), the layout a gated projection's kernel takes (kernel.tactic.GATE_GROUP_ROWS)."""
    check_weight(gate)
    check_weight(up)
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        raise ValueError(f"gate and up weights must match in shape, dtype and device, got {describe(gate)} and "
                         f"{describe(up)}")
    gate, up = gate.detach(), up.detach()  # a copy the kernel reads, outside autograd
    n, k = gate.shape
    half = GATE_GROUP_ROWS // 2
    full, rest = divmod(n, half)
    weight = gate.new_zeros(full + (rest > 0), 2, half, k)
    for part, source in enumerate((gate, up)):
        weight[:full, part] = source[: full * half].reshape(full, half, k)
        if rest:
            weight[full, part, :rest] = source[full * half :]
    return weight.view(-1, k)


def interleaved_rows(gated_rows: int) -> int:
    """Rows of the weight ``interleave_gate_up`` makes of a gate/up pair of ``gated_rows`` rows each."""
    return GATE_GROUP_ROWS * -(-gated_rows // (GATE_GROUP_ROWS // 2))


def check_gated_rows(gated_rows, weight):
    """Raise unless ``gated_rows`` is None or the N of a gate/up pair that ``weight`` interleaves."""
    if gated_rows is None:
        return
    if not is_batch(gated_rows):
        raise TypeError(f"gated_rows must be a positive int (the gate weight's rows), got {gated_rows!r}")
    if weight.shape[0] != interleaved_rows(gated_rows):
        raise ValueError(f"a gated weight of {gated_rows} gate rows interleaves {interleaved_rows(gated_rows)} "
                         f"rows (interleave_gate_up), got {describe(weight)}")


def vector_view(vector):
    """A 1-D tensor as the kernel takes it (the bias), outside autograd."""
    vector = vector.detach()
    result = to_cute(vector.as_strided((vector.shape[0],), (1,)), assumed_align=vector.element_size())
    return result.mark_layout_dynamic(leading_dim=0)


def is_batch(batch) -> bool:
    """Whether ``batch`` can be a padded batch of a policy: a positive int (a bool is not one)."""
    return isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1


def check_batches(batches, owner: str) -> tuple:
    """``batches`` as a tuple of at least one padded batch; else a TypeError/ValueError naming ``owner``."""
    try:
        found = tuple(batches)
    except TypeError:
        raise TypeError(f"{owner} batches must be an iterable of positive ints, got {batches!r}") from None
    if not found or not all(map(is_batch, found)):
        raise ValueError(f"{owner} batches must be positive ints (not bools), at least one, got {found}")
    return found


def policies_for(weight, batches, *, output_dtype, batch_invariant=False):
    """``({batch: tactic}, {batch: "table" | "heuristic"})`` for ``weight`` on its GPU: a table's tactics where
    one holds the shape (a shipped one, or one named in DECODE_PROJECTION_TABLES), else the heuristic's."""
    n, k = weight.shape
    gpu = gpu_spec(weight.device)
    policies, sources = resolve_policies(n, k, batches, gpu=gpu, weight_dtype=weight.dtype,
                                         output_dtype=output_dtype, batch_invariant=batch_invariant)
    mode = " batch-invariant" if batch_invariant else ""
    _log_policy_sources(gpu.name, f"{n}x{k} {dtype_name(weight.dtype)}->{dtype_name(output_dtype)}{mode}",
                        tuple(sorted(sources.items())))
    return policies, sources


def gated_policies(policies, weight: torch.Tensor) -> dict:
    """``policies`` with each tactic that cannot gate the interleaved ``weight`` replaced by the nearest that can on
    its GPU (policy.policies.gated_tactic)."""
    gpu = gpu_spec(weight.device)
    n, k = weight.shape
    return {batch: gated_tactic(tactic, n, k, batch, gpu) for batch, tactic in policies.items()}


@cache
def _log_policy_sources(gpu: str, shape: str, sources: tuple) -> None:
    """Say, once per GPU, shape and batches, whether a table or the heuristic chose the tactics."""
    tabled = sorted(batch for batch, source in sources if source == "table")
    guessed = sorted(batch for batch, source in sources if source != "table")
    if not tabled:
        logger.info("no table for %s holds %s: heuristic tactics", gpu, shape)
    elif not guessed:
        logger.info("%s on %s: tactics from a table", shape, gpu)
    else:
        logger.info("%s on %s: a table's tactics for batches %s, the heuristic's for %s", shape, gpu, tabled, guessed)


class _Launchable(NamedTuple):
    """What a completed ``prepare()`` hands ``run()``, which reads it once per launch: a ``prepare()`` in another
    thread then never shows it half built."""

    weight: torch.Tensor
    storage: tuple  # PreparedProjection._storage(weight) as prepared
    weight_view: object
    kernels: dict  # batch -> compiled kernel
    output_dtype: torch.dtype
    device: torch.device
    epilogue: Epilogue
    bias: torch.Tensor | None
    bias_storage: tuple | None  # PreparedProjection._storage(bias) as prepared
    bias_view: object  # the bias as the kernel takes it (None without one)
    bias_row: torch.Tensor | None  # the bias as a [1, N] view, for run()'s overlap check without a new view per run
    output_rows: int  # N of the output: the weight's rows, or a gated projection's gate rows
    captured: list  # [True] once a CUDA graph captured a launch of it, else []
    slots: CallSlots  # the kernels' arguments, reused launch after launch


class PreparedProjection:
    """Split-K projection with a per-batch tactic table and caller-owned outputs.

    ``programmatic_launch`` (default True) launches with programmatic dependent
    launch: the weight streams while the previous kernel finishes, which pays
    where that kernel triggers its dependents early (another projection does).
    After a kernel that never does, as PyTorch's do not, False measured
    0.14-0.53 us faster per launch on the H200 (docs/programmatic-launch.md).
    With it, the first weight stages load before the kernel waits on the
    previous one, which only the activations and the output depend on: a kernel
    that writes the weight and triggers its dependents early must not come just
    before ``run`` (launch with ``programmatic_launch=False`` there).

    Every launch encodes the weight's TMA map and passes it by value, as it
    does the activations'. A CUDA graph that captured ``run`` holds the map of
    the weight's storage at capture: new values copied into that storage in
    place reach it, as they reach a graph over ``nn.Linear``. A weight of new
    storage (assigned, or loaded with ``assign=True``) needs ``prepare()`` and
    graphs captured again; the projection keeps every weight (and bias) a graph
    captured alive until it dies, so graphs captured before go on computing
    with the old weight rather than reading freed memory.

    ``run`` and ``prepare`` may be called from several threads: a ``run`` while
    another thread prepares raises a ValueError saying the projection is not
    prepared; replaying a graph meanwhile is not safe.

    Epilogues, summed in FP32 with the product before the one rounding to the
    output dtype: ``bias`` (``[N]``, BF16, FP16 or FP32) is added to every row
    of the output; with ``residual=True`` every ``run`` takes a residual
    (``run(x, out, residual=r)``, ``r`` shaped and typed as ``out``, or ``out``
    itself). Split K adds them once, on the rank that stores the fixed-order
    sum, so results stay bitwise repeatable and batch-invariant. Under a
    row-parallel tensor split the output is a partial sum before the
    all-reduce: a bias or residual added on every rank is added once per rank,
    so give them to one rank only, or add them after the all-reduce.
    """

    def __init__(self, weight, policies, *, output_dtype=torch.bfloat16, programmatic_launch=True, bias=None,
                 residual=False, gated_rows=None):
        self.weight, self.output_dtype, self.programmatic_launch = weight, output_dtype, programmatic_launch
        self.bias, self.residual, self.gated_rows = bias, residual, gated_rows
        self.policies = policies
        self._validate()
        self.device = weight.device
        self.policy_sources = dict.fromkeys(self.policies, "given")
        self._launchable = None
        self._launch_lock = threading.Lock()  # held by run() while it checks and launches
        self._prepare_lock = threading.Lock()  # one prepare() at a time
        self._captured_operands = []  # (weight, bias) of every prepare() a CUDA graph captured: graphs may read them

    def _validate(self):
        """Raise unless the kernel takes the weight, output dtype, launch flag and policies; ``policies`` become
        ``{batch: SplitKTactic}``. Run again by ``prepare``: any of them may have been replaced since."""
        check_weight(self.weight)
        check_launch_options(self.output_dtype, self.programmatic_launch)
        check_bias(self.bias, self.weight)
        if not isinstance(self.residual, bool):
            raise TypeError(f"residual must be a bool (whether run() takes one), got {self.residual!r}")
        check_gated_rows(self.gated_rows, self.weight)
        if self.gated_rows is not None and (self.bias is not None or self.residual):
            raise ValueError("a gated projection writes silu(gate) * up: it takes no bias or residual")
        policies = {}
        for batch, tactic in dict(self.policies).items():
            if not is_batch(batch):
                raise ValueError(f"policy batch must be a positive int, got {batch!r}")
            tactic = as_tactic(tactic)
            problems = gated_problems(tactic) if self.gated_rows is not None else []
            if problems:
                raise ValueError(f"policy batch {batch}: {tactic} cannot gate: {'; '.join(problems)} "
                                 "(policy.policies.gated_tactic gives the nearest that can)")
            m_tiles = tactic.grid_rows(batch)
            if m_tiles > MOST_GRID_ROWS:
                raise ValueError(f"policy batch {batch} needs {m_tiles} activation tiles of {tactic.activation_rows} "
                                 f"rows, more than a launch's {MOST_GRID_ROWS}")
            columns = tactic.grid_columns(self.weight.shape[0])
            if columns > MOST_GRID_COLUMNS:
                raise ValueError(f"{tactic} needs a grid {columns} CTAs wide for {self.weight.shape[0]} weight rows, "
                                 f"more than a launch's {MOST_GRID_COLUMNS}")
            policies[batch] = tactic
        if not policies:
            raise ValueError("a projection needs a policy for at least one batch ({batch: tactic}), got none")
        self.policies = policies

    @classmethod
    def for_weight(cls, weight, batches=(1, 2, 4, 8, 16, 32, 64), *, output_dtype=torch.bfloat16,
                   batch_invariant=False, programmatic_launch=True, bias=None, residual=False):
        """A prepared projection whose tactics come from a shipped table for this GPU, else the heuristic.

        ``policy_sources`` says, per batch, which one was used. The tables were tuned with
        programmatic launch, timed both back to back and after a foreign kernel.
        """
        batches = check_batches(batches, "for_weight")
        check_weight(weight)
        architecture(weight.device)
        policies, sources = policies_for(weight, batches, output_dtype=output_dtype, batch_invariant=batch_invariant)
        projection = cls(weight, policies, output_dtype=output_dtype, programmatic_launch=programmatic_launch,
                         bias=bias, residual=residual)
        projection.policy_sources = sources
        return projection.prepare()

    @classmethod
    def gated(cls, gate_weight, up_weight, batches=(1, 2, 4, 8, 16, 32, 64), *, output_dtype=torch.bfloat16,
              programmatic_launch=True):
        """A prepared projection whose ``run(x, out)`` writes ``silu(x @ gate^T) * (x @ up^T)`` [M, N], summed in
        FP32 and rounded once, from one kernel.

        It owns a copy of both weights, interleaved eight rows at a time (``interleave_gate_up``; as many bytes
        as the two weights, plus up to 7 zero rows each): drop the originals if nothing else needs them, and keep
        the projection alive until its launches on any stream have run and while graphs that captured it may
        replay. The tactics are the tables' (or the heuristic's) for the interleaved shape where they can gate,
        else the nearest that can (``policy.policies.gated_tactic``; ``policy_sources`` says "gated" for those).
        """
        batches = check_batches(batches, "gated")
        weight = interleave_gate_up(gate_weight, up_weight)
        architecture(weight.device)
        policies, sources = policies_for(weight, batches, output_dtype=output_dtype)
        gated = gated_policies(policies, weight)
        sources = {batch: source if gated[batch] == policies[batch] else "gated" for batch, source in sources.items()}
        projection = cls(weight, gated, output_dtype=output_dtype, programmatic_launch=programmatic_launch,
                         gated_rows=gate_weight.shape[0])
        projection.policy_sources = sources
        return projection.prepare()

    @property
    def kernels(self) -> dict:
        """``{batch: compiled kernel}`` of the last completed ``prepare()``; empty before one or after one failed."""
        launchable = self._launchable
        return launchable.kernels if launchable is not None else {}

    @property
    def captured_operands(self) -> tuple:
        """``(weight, bias)`` of every ``prepare()`` a CUDA graph captured a launch of, kept alive with the
        projection: graphs captured before a new weight go on reading them."""
        return tuple(self._captured_operands)

    @property
    def weight_view(self):
        """The weight as the kernel takes it, as of the last completed ``prepare()`` (None before one)."""
        launchable = self._launchable
        return launchable.weight_view if launchable is not None else None

    def prepare(self):
        """Compile (or fetch) each batch's kernel, all or nothing.

        A re-prepare (after ``weight`` or ``policies`` changed) checks them as the constructor does; graphs captured
        before keep the weight they captured (see the class docstring).
        """
        if capturing():
            raise RuntimeError("prepare() cannot run while this stream captures a CUDA graph: it may wait for "
                               "the device; prepare before capturing")
        with self._prepare_lock:
            with self._launch_lock:
                # Until this prepare completes, run() refuses: the kernels may be replaced.
                self._launchable = None
            self._validate()
            self.device = self.weight.device
            arch = architecture(self.device)
            epilogue = Epilogue(self.residual, None if self.bias is None else self.bias.dtype,
                                self.gated_rows is not None)
            kernels = {}
            for batch, tactic in self.policies.items():
                code = compile_projection(tactic, self.output_dtype, arch, self.weight.dtype, self.programmatic_launch,
                                          epilogue)
                _claim_device(code, self.device)
                kernels[batch] = code
            weight_view = matrix_view(self.weight)
            bias_view = None if self.bias is None else vector_view(self.bias)
            self._launchable = _Launchable(self.weight, self._storage(self.weight), weight_view,
                                           kernels, self.output_dtype, self.device, epilogue, self.bias,
                                           None if self.bias is None else self._storage(self.bias), bias_view,
                                           None if self.bias is None else self.bias.detach().unsqueeze(0),
                                           self.gated_rows or self.weight.shape[0], [],
                                           CallSlots((weight_view, bias_view), launch_value_kinds(epilogue)))
        return self

    @staticmethod
    def _storage(weight):
        """What a prepared launch takes of the weight: its storage and layout."""
        return (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype, weight.device)

    def is_prepared_for(self, weight, bias=None) -> bool:
        """Whether the last completed ``prepare()`` took ``weight``'s storage as it is now, and
        ``bias``'s storage (or no bias)."""
        launchable = self._launchable
        if launchable is None or launchable.storage != self._storage(weight):
            return False
        if bias is None or launchable.bias is None:
            return bias is None and launchable.bias is None
        return self._storage(bias) == launchable.bias_storage

    def _check(self, x, out, launchable):
        """Raise a TypeError/ValueError naming whatever about x or out the kernel cannot take."""
        for name, tensor in (("input", x), ("output", out)):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"projection {name} must be a torch.Tensor, got {type(tensor)}")
            if tensor.dim() != 2:
                raise ValueError(f"projection {name} must be 2-D, got {describe(tensor)}")
            if tensor.stride(1) != 1:
                raise ValueError(f"projection {name} rows need unit stride, got {describe(tensor)}")
            if tensor.is_neg():
                # A lazily negated view: the kernel reads and writes its storage as is.
                raise ValueError(f"projection {name} is a negated view; resolve it first (tensor.resolve_neg())")
        if launchable is None:
            raise ValueError("projection is not prepared: call prepare() first (and not while it runs in another "
                             "thread)")
        for name, tensor in (("input", x), ("output", out)):
            if tensor.device != launchable.device:
                raise ValueError(f"projection {name} is on {tensor.device}, the weight on {launchable.device}")
        if self._storage(self.weight) != launchable.storage:
            raise ValueError(
                "projection weight storage changed after prepare(): "
                f"{describe(self.weight)}; call prepare() again"
            )
        weight = launchable.weight
        k = weight.shape[1]
        batch, x_cols = x.shape
        if batch not in launchable.kernels or x_cols != k:
            raise ValueError(
                f"projection input {tuple(x.shape)}: prepared batches "
                f"{sorted(launchable.kernels)}, K {k}"
            )
        if x.dtype != weight.dtype:
            raise ValueError(f"projection input dtype {x.dtype} != weight dtype {weight.dtype}")
        x_stride = x.stride(0) if batch > 1 else 0
        if x_stride * x.element_size() % TMA_ALIGN or x.data_ptr() % TMA_ALIGN:
            raise ValueError(
                f"projection input needs a 16 B aligned base and row pitch, got {describe(x)}"
            )
        if batch > 1 and x_stride < k:
            raise ValueError(f"projection input rows overlap: {describe(x)}")
        if batch >= 2**31:
            raise ValueError(f"projection batch must be below 2^31, got {describe(x)}")
        grad = torch.is_grad_enabled()
        if x.requires_grad and grad:
            raise ValueError("projection input requires grad, and autograd does not flow through run(): detach it "
                             "or run under torch.no_grad() (ProjectionLinear's op raises on backward instead)")
        if out.requires_grad and grad:
            raise ValueError("projection output requires grad: the kernel writes it outside autograd "
                             "(pass one that does not, or run under torch.no_grad())")
        if out.dtype != launchable.output_dtype:
            raise ValueError(f"projection output dtype {out.dtype} != {launchable.output_dtype}")
        n = launchable.output_rows
        if tuple(out.shape) != (batch, n):
            raise ValueError(f"projection output must be {(batch, n)}, got {describe(out)}")
        if out.stride(0) < n and batch > 1:
            raise ValueError(f"projection output rows overlap: {describe(out)}")
        if overlaps(out, x, weight):
            raise ValueError("projection output overlaps its input or weight")

    def _check_epilogue(self, x, out, residual, launchable):
        """Raise a TypeError/ValueError naming whatever about ``residual`` or the bias the kernel cannot take (after
        ``_check`` passed)."""
        if (self.bias is not launchable.bias or self.residual != launchable.epilogue.residual
                or (self.bias is not None and self._storage(self.bias) != launchable.bias_storage)):
            raise ValueError("projection bias or residual changed after prepare(); call prepare() again")
        if launchable.bias_row is not None and overlaps(out, launchable.bias_row):
            raise ValueError("projection output overlaps its bias")
        if not launchable.epilogue.residual:
            if residual is not None:
                raise ValueError("this projection was prepared without a residual: PreparedProjection(..., "
                                 "residual=True) adds one")
            return
        if residual is None:
            raise ValueError("this projection adds a residual: run(x, out, residual=r), r shaped as out (or out)")
        check_residual(residual, out, x, launchable.weight)

    def run(self, x, out, residual=None):
        """Launch ``out = x @ weight^T`` (plus the bias, and ``residual`` where prepared with ``residual=True``)
        on the weight device's current stream; returns ``out``."""
        with self._launch_lock:
            launchable = self._launchable
            self._check(x, out, launchable)
            self._check_epilogue(x, out, residual, launchable)
            batch = x.shape[0]
            # A graph captures these arguments, the weight's map (encoded from its view at launch) among them.
            values = launch_values(x, out, residual, launchable.output_rows, launchable.device)
            code = launchable.kernels[batch]
            if torch.cuda.current_device() == launchable.device.index:
                self._launch(code, values, launchable)
            else:
                with torch.cuda.device(launchable.device):
                    self._launch(code, values, launchable)
        # An in-place write autograd cannot see: a backward that saved ``out`` before this now fails loudly.
        increment_version(out)
        return out

    def _launch(self, code, values, launchable):
        """Launch on the current device; where a CUDA graph captures the launch, keep the weight and bias it reads
        alive with the projection (once per pair)."""
        launchable.slots.launch(code, values, lambda: launch_arguments(
            launchable.weight_view, launchable.bias_view, values, launchable.weight.dtype, launchable.output_dtype))
        if not launchable.captured and capturing():
            launchable.captured.append(True)
            if not any(weight is launchable.weight and bias is launchable.bias
                       for weight, bias in self._captured_operands):
                self._captured_operands.append((launchable.weight, launchable.bias))
