"""The decode glue as PyTorch custom ops, for chaining a whole block between projections.

Importing this module registers, with fake (meta) implementations so that ``torch.compile(fullgraph=True)``
traces them without graph breaks and CUDA graphs capture them:

- ``torch.ops.decode_projection.rms_norm(x, weight, eps) -> y``
- ``torch.ops.decode_projection.fused_add_rms_norm(x, residual, weight, eps) -> (y, x + residual)``
- ``torch.ops.decode_projection.silu_and_mul(x) -> silu(x[..., :N]) * x[..., N:]``

(the functions of the same names here call them). Inputs may have any leading shape ``[..., H]``; outputs are
new contiguous tensors. On CUDA they launch this package's PDL-aware kernels (``norm.py``, ``activation.py``,
which state the math and take caller-owned outputs, in place too); an input whose rows the kernels cannot take as
they are (not 16-byte aligned, say) is copied once first, and what no copy can fix (a dtype other than BF16/FP16,
a width not a multiple of 8, a GPU other than Hopper) raises a ValueError. On the CPU the same formulas run as
PyTorch ops in FP32 with one rounding per output: a reference a model can run anywhere, and what lets
``torch.library.opcheck`` test the ops without a GPU.
"""

import math

import torch
import torch.nn.functional as F

from .kernel import activation, norm
from .kernel.rowwise import ALIGN, VECTOR


def _kernel_rows(op, tensor):
    """``tensor`` [..., width] as 2-D rows the kernels take: a view where one will do, else a contiguous copy."""
    if tensor.dim() < 1:
        raise ValueError(f"{op} input must have a last dimension [..., H], got a 0-D tensor")
    width = tensor.shape[-1]
    rows = tensor.reshape(math.prod(tensor.shape[:-1]), width)
    pitch = rows.stride(0) if rows.shape[0] > 1 else width
    if rows.stride(-1) != 1 or pitch % VECTOR or pitch < width or rows.data_ptr() % ALIGN:
        rows = rows.clone(memory_format=torch.contiguous_format)
    return rows


def _kernel_vector(tensor):
    """A 1-D ``tensor`` contiguous and 16-byte aligned (copied if not)."""
    if tensor.dim() == 1 and (tensor.stride(0) != 1 or tensor.data_ptr() % ALIGN):
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tensor


@torch.library.custom_op("decode_projection::rms_norm", mutates_args=(), device_types="cuda")
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` by the norm kernel."""
    y = norm.rms_norm(_kernel_rows("rms_norm", x), _kernel_vector(weight), eps)
    return y.view(x.shape)


@_rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@_rms_norm.register_kernel("cpu")
def _(x, weight, eps):
    return _rms_norm_reference(x, weight, eps)


def _rms_norm_reference(x, weight, eps):
    """The norm in FP32, rounded once to ``x``'s dtype."""
    value = x.float()
    rstd = torch.rsqrt(value.pow(2).mean(-1, keepdim=True) + eps)
    return (value * rstd * weight.float()).to(x.dtype)


@torch.library.custom_op("decode_projection::fused_add_rms_norm", mutates_args=(), device_types="cuda")
def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual) * weight, x + residual)`` by the fused norm kernel."""
    if residual.shape != x.shape:
        # The kernel would say so too, but of the flattened rows.
        raise ValueError(f"fused_add_rms_norm residual must be {tuple(x.shape)} like the input, "
                         f"got {tuple(residual.shape)}")
    y, total = norm.fused_add_rms_norm(_kernel_rows("fused_add_rms_norm", x),
                                       _kernel_rows("fused_add_rms_norm", residual),
                                       _kernel_vector(weight), eps)
    return y.view(x.shape), total.view(x.shape)


@_fused_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@_fused_add_rms_norm.register_kernel("cpu")
def _(x, residual, weight, eps):
    total = (x.float() + residual.float()).to(x.dtype)
    return _rms_norm_reference(total, weight, eps), total


@torch.library.custom_op("decode_projection::silu_and_mul", mutates_args=(), device_types="cuda")
def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :N]) * x[..., N:]`` by the SiLU-and-mul kernel."""
    out = activation.silu_and_mul(_kernel_rows("silu_and_mul", x))
    return out.view(*x.shape[:-1], x.shape[-1] // 2)


@_silu_and_mul.register_fake
def _(x):
    return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)


@_silu_and_mul.register_kernel("cpu")
def _(x):
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def rms_norm(x, weight, eps=1e-6):
    """``torch.ops.decode_projection.rms_norm``: a new ``x / sqrt(mean(x^2, -1) + eps) * weight``."""
    norm.check_eps("rms_norm", eps)
    return torch.ops.decode_projection.rms_norm(x, weight, float(eps))


def fused_add_rms_norm(x, residual, weight, eps=1e-6):
    """``torch.ops.decode_projection.fused_add_rms_norm``: new ``(rms_norm(x + residual) * weight, x + residual)``."""
    norm.check_eps("fused_add_rms_norm", eps)
    return torch.ops.decode_projection.fused_add_rms_norm(x, residual, weight, float(eps))


def silu_and_mul(x):
    """``torch.ops.decode_projection.silu_and_mul``: a new ``silu(x[..., :N]) * x[..., N:]``, N = width / 2."""
    return torch.ops.decode_projection.silu_and_mul(x)
