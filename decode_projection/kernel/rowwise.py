"""Host side shared by the row-wise decode glue kernels (``norm.py``, ``activation.py``).

Those kernels read and write rows of 16-bit elements 16 bytes (``VECTOR`` = 8
elements) at a time. Every row must therefore start on a 16-byte boundary: a
unit stride along the row, a 16-byte aligned base, and a row pitch and row
length that are whole multiples of 8 elements. A row-slice or column-slice of a
wider buffer that keeps those is a legal operand; anything else is refused with
a message that says which property is missing.

Each kernel is compiled once per code variant, its entry point taking every operand as a pointer with the rows,
the width and each operand's row pitch as runtime integers (``rows_tensor``, ``vector_tensor`` build the tensors
inside the compiled host function), so one compiled function serves every batch, width and buffer. A DLPack view
per operand per call, and the DSL's marshalling of it, would cost an eager call several times the PyTorch op it
replaces (docs/host-cost.md): ``launch`` writes the call's addresses and extents into the kernel's call slots
(runtime/call_slots.py) instead.
"""

import ctypes
import threading
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cuda.bindings import driver

from ..runtime import architecture, byte_rows, describe, pointer, rows_overlap
from ..runtime.call_slots import CallSlots

VECTOR = 8  # 16-bit elements per 16-byte load or store
ALIGN = 16  # bytes: base address, row pitch and row length granularity
ELEMENT_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}
MOST_ROWS = 2**31 - 1  # CUDA's limit on a grid's x dimension, where the kernels put the rows
# The DSL's type of each C value an entry point takes, other than pointers (the stream's handle is one).
DSL_NUMBERS = {ctypes.c_int32: cutlass.Int32, ctypes.c_int64: cutlass.Int64, ctypes.c_float: cutlass.Float32}


def rows_tensor(rows_pointer, rows, width, pitch):
    """In a compiled entry: the (rows, width) operand at ``rows_pointer`` with row pitch ``pitch``, typed as a dynamic
    DLPack view of checked rows is: every extent dynamic, width and pitch multiples of VECTOR, unit stride along a
    row."""
    layout = cute.make_layout((rows, cute.assume(width, divby=VECTOR)), stride=(cute.assume(pitch, divby=VECTOR), 1))
    return cute.make_tensor(rows_pointer, layout)


def vector_tensor(vector_pointer, width):
    """In a compiled entry: the contiguous (width,) operand at ``vector_pointer``, width a multiple of VECTOR."""
    return cute.make_tensor(vector_pointer, cute.make_layout((cute.assume(width, divby=VECTOR),), stride=(1,)))


def vectors(tensor, row):
    """Device side: row ``row`` of a (rows, width) tensor as (VECTOR, width / VECTOR), column ``i`` its 16-byte
    vector ``i``."""
    return cute.logical_divide(tensor[row, None], cute.make_layout(VECTOR))


def dsl_arguments(kinds: NamedTuple, values, dtype, stream) -> tuple:
    """An entry point's arguments in the DSL's types: ``values``, one per field of ``kinds`` (the C types of the
    call slots, the stream's handle last), with each address a 16-byte aligned pointer to ``dtype``, each number
    its DSL type, and ``stream`` in the handle's place."""
    *operands, _handle = zip(kinds, values)
    return (*(None if kind is None else pointer(ELEMENT_DTYPES[dtype], value, ALIGN) if kind is ctypes.c_void_p
              else DSL_NUMBERS[kind](value) for kind, value in operands), stream)


def placeholder_values(kinds: NamedTuple) -> NamedTuple:
    """Values of the types ``kinds`` names, to compile an entry point against (null addresses, units): the compiled
    code takes each as a runtime value, so which ones they are does not matter."""
    return kinds._make(None if kind is None else 0 if kind is ctypes.c_void_p else kind(1).value for kind in kinds)


def check_tensor(op, name, tensor, *, dims, dtype=None, device=None):
    """Raise a TypeError/ValueError unless ``tensor`` is a ``dims``-D BF16/FP16 tensor with unit stride along its last
    dimension, not a negated view, of ``dtype`` and on ``device`` where given, else (the input) on a Hopper GPU,
    whose ``--gpu-arch`` it then returns."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op} {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != dims:
        shape = "[rows, width]" if dims == 2 else "[width]"
        raise ValueError(f"{op} {name} must be {dims}-D {shape}, got {describe(tensor)}")
    if tensor.dtype not in ELEMENT_DTYPES:
        raise ValueError(f"{op} {name} must be BF16 or FP16, got {tensor.dtype}")
    if dtype is not None and tensor.dtype != dtype:
        raise ValueError(f"{op} {name} dtype {tensor.dtype} != input dtype {dtype}")
    arch = None
    if device is None:
        try:
            arch = architecture(tensor.device)  # a CUDA device of compute capability 9.0
        except ValueError as error:
            raise ValueError(f"{op} {name}: {error}") from None
    elif tensor.device != device:
        raise ValueError(f"{op} {name} is on {tensor.device}, the input on {device}")
    if tensor.is_neg():
        # A lazily negated view: the kernel would read or write its storage as is.
        raise ValueError(f"{op} {name} is a negated view; resolve it first (tensor.resolve_neg())")
    if tensor.numel() and tensor.stride(-1) != 1:
        raise ValueError(f"{op} {name} needs unit stride along its last dimension, got {describe(tensor)}")
    return arch


def check_rows_alignment(op, name, tensor):
    """Raise a ValueError unless a 2-D ``tensor``'s rows are 16-byte vectors: aligned base, pitch and width."""
    rows, width = tensor.shape
    pitch = tensor.stride(0) if rows > 1 else 0
    if width == 0:
        raise ValueError(f"{op} {name} rows are empty: {describe(tensor)}")
    if width % VECTOR:
        raise ValueError(f"{op} {name} width must be a multiple of {VECTOR}, got {describe(tensor)}")
    if pitch % VECTOR or tensor.data_ptr() % ALIGN:
        raise ValueError(f"{op} {name} needs a 16-byte aligned base and row pitch (.contiguous() gives both), "
                         f"got {describe(tensor)} at {tensor.data_ptr():#x}")
    if rows > 1 and pitch < width:
        raise ValueError(f"{op} {name} rows overlap (an expanded or strided view?): {describe(tensor)}")
    if rows > MOST_ROWS:
        raise ValueError(f"{op} {name} has {rows} rows, more than a launch's {MOST_ROWS}")


def check_dtype(op, dtype):
    """Raise a ValueError unless the kernels take ``dtype``."""
    if dtype not in ELEMENT_DTYPES:
        raise ValueError(f"{op} takes {' or '.join(map(str, ELEMENT_DTYPES))}, got {dtype}")


def check_launch_flag(op, programmatic_launch):
    """Raise a TypeError unless ``programmatic_launch`` is a bool."""
    if not isinstance(programmatic_launch, bool):
        raise TypeError(f"{op} programmatic_launch must be a bool, got {programmatic_launch!r}")


def check_writable(op, name, tensor):
    """Raise a ValueError if ``tensor`` is an output autograd would need to see written."""
    if tensor.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{op} {name} requires grad: the kernel writes it outside autograd "
                         "(pass one that does not, or run under torch.no_grad())")


def check_no_overlap(op, written, others):
    """Raise a ValueError if the output ``written`` = (name, tensor) shares a byte with any of ``others``
    (name, tensor, exact_alias_allowed) other than by being exactly that tensor where that is allowed: the same
    bytes in the same rows (the operands' dtypes are checked alike before)."""
    name, tensor = written
    mine = byte_rows(tensor)
    for other_name, other, alias_allowed in others:
        theirs = byte_rows(other)
        if alias_allowed and theirs == mine:
            continue
        if rows_overlap(mine, theirs):
            allowed = " (it may only be exactly that tensor)" if alias_allowed else ""
            raise ValueError(f"{op} {name} overlaps its {other_name}{allowed}")


class _Launcher(NamedTuple):
    """A compiled kernel's device and its call slots, with the lock that keeps one launch's values in them at a
    time (the glue ops may be called from several threads)."""

    code: object  # kept, so that its id, the key of this launcher, stays its own
    device: torch.device
    slots: CallSlots
    lock: threading.Lock


# A compiled function loads its module on the device current at its first call and stays bound to it
# (CuTe DSL 4.8.1): launched on a second GPU it would run in the wrong context. Refused until each device
# gets its own executor.
_launchers = {}


def launch(op, code, device, kinds: NamedTuple, values, dtype):
    """Call compiled ``code`` on ``device`` with ``values`` (addresses, extents and the current stream's handle, one
    per field of ``kinds``) through its call slots; its first launch goes through the DSL's own call, with ``dtype``
    the operands' element type."""
    launcher = _launchers.get(id(code))
    if launcher is None:
        launcher = _launchers.setdefault(id(code), _Launcher(code, device, CallSlots((), kinds), threading.Lock()))
    if launcher.device != device:
        raise ValueError(f"{op} already runs on {launcher.device}; glue ops on several GPUs in one process are not "
                         f"supported yet (input on {device})")

    def arguments():
        return dsl_arguments(kinds, values, dtype, driver.CUstream(values[-1]))

    with launcher.lock:
        if torch.cuda.current_device() == device.index:
            launcher.slots.launch(code, values, arguments)
        else:
            with torch.cuda.device(device):
                launcher.slots.launch(code, values, arguments)
