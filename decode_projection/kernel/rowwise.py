"""Host side shared by the row-wise decode glue kernels (``norm.py``, ``activation.py``).

Those kernels read and write rows of 16-bit elements 16 bytes (``VECTOR`` = 8
elements) at a time. Every row must therefore start on a 16-byte boundary: a
unit stride along the row, a 16-byte aligned base, and a row pitch and row
length that are whole multiples of 8 elements. A row-slice or column-slice of a
wider buffer that keeps those is a legal operand; anything else is refused with
a message that says which property is missing.

Kernels are compiled once per code variant against fake tensors whose extents
and row pitch are runtime symbols, so one compiled function serves every batch,
width and buffer; ``rows_view`` and ``vector_view`` convert torch tensors to
the matching CuTe tensors explicitly (never a ``torch.Tensor`` straight into a
compiled function).
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from ..runtime import architecture, current_stream, describe, overlaps, to_cute

VECTOR = 8  # 16-bit elements per 16-byte load or store
ALIGN = 16  # bytes: base address, row pitch and row length granularity
ELEMENT_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}
MOST_ROWS = 2**31 - 1  # CUDA's limit on a grid's x dimension, where the kernels put the rows


def fake_rows(dtype):
    """A symbolic (rows, width) operand: width and pitch multiples of VECTOR, unit stride along a row."""
    shape = (cute.sym_int(), cute.sym_int(divisibility=VECTOR))
    stride = (cute.sym_int64(divisibility=VECTOR), 1)
    return make_fake_tensor(ELEMENT_DTYPES[dtype], shape, stride, assumed_align=ALIGN)


def fake_vector(dtype):
    """A symbolic contiguous (width,) operand, width a multiple of VECTOR."""
    return make_fake_tensor(ELEMENT_DTYPES[dtype], (cute.sym_int(divisibility=VECTOR),), (1,), assumed_align=ALIGN)


def vectors(tensor, row):
    """Device side: row ``row`` of a (rows, width) tensor as (VECTOR, width / VECTOR), column ``i`` its 16-byte
    vector ``i``."""
    return cute.logical_divide(tensor[row, None], cute.make_layout(VECTOR))


def rows_view(tensor):
    """A checked 2-D tensor as the CuTe tensor ``fake_rows`` stands for."""
    rows, width = tensor.shape
    # A single row's pitch is never used, and PyTorch may report any stride there.
    pitch = tensor.stride(0) if rows > 1 else width
    if tensor.requires_grad:  # DLPack refuses these; the kernels never take part in autograd
        tensor = tensor.detach()
    view = to_cute(tensor.as_strided((rows, width), (pitch, 1)), assumed_align=ALIGN)
    # Named, not deduced: a single row has a size-1 dimension whose stride may also be 1.
    return view.mark_layout_dynamic(leading_dim=1)


def vector_view(tensor):
    """A checked contiguous 1-D tensor as the CuTe tensor ``fake_vector`` stands for."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    return to_cute(tensor, assumed_align=ALIGN).mark_layout_dynamic(leading_dim=0)


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


def same_elements(a, b):
    """Whether two 2-D tensors are the very same elements (one buffer passed twice)."""
    if a.data_ptr() != b.data_ptr() or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.shape[0] <= 1 or a.stride(0) == b.stride(0)


def check_no_overlap(op, written, others):
    """Raise a ValueError if the output ``written`` = (name, tensor) shares a byte with any of ``others``
    (name, tensor, exact_alias_allowed) other than by being exactly that tensor where that is allowed."""
    name, tensor = written
    for other_name, other, alias_allowed in others:
        if alias_allowed and same_elements(tensor, other):
            continue
        if overlaps(tensor, other if other.dim() == 2 else other.view(1, -1)):
            allowed = " (it may only be exactly that tensor)" if alias_allowed else ""
            raise ValueError(f"{op} {name} overlaps its {other_name}{allowed}")


# A compiled function loads its module on the device current at its first call and stays bound to it
# (CuTe DSL 4.8.1): launched on a second GPU it would run in the wrong context. Refused until each device
# gets its own executor.
_kernel_devices = {}


def launch(op, code, device, *args):
    """Call compiled ``code`` on ``device``'s current stream with CuTe ``args``."""
    bound = _kernel_devices.setdefault(id(code), (code, device))[1]
    if bound != device:
        raise ValueError(f"{op} already runs on {bound}; glue ops on several GPUs in one process are not "
                         f"supported yet (input on {device})")
    if torch.cuda.current_device() == device.index:
        code(*args, current_stream(device))
    else:
        with torch.cuda.device(device):
            code(*args, current_stream(device))
