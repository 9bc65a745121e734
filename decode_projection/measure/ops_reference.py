"""Float64 references for the decode glue ops, the PyTorch ops they replace, and how outputs are judged.

The glue kernels compute in FP32 and round each output once, so every element must be a faithful rounding of
the float64 value: within one unit in the last place of the output dtype (FP32's own error, about 1e-6 relative
here, is a thousandth of a BF16 ulp). That is checked element by element, and, as for the projection
(``checks.py``), the relative Frobenius error must be at most twice what PyTorch's own ops make on the same
inputs. The PyTorch formulas round twice (``x * rstd`` before the weight as models write it out, ``silu(g)``
before ``* up``), so their elements may be further off; the ulp bound is the stricter of the two for us. The worst element's coordinates
are printed on failure.
"""

import math

import torch
import torch.nn.functional as F

from .checks import relative_error

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126}


def rms_norm_float64(x, weight, eps):
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` in float64."""
    value = x.double()
    return value * torch.rsqrt(value.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def silu_and_mul_float64(x):
    """``silu(x[..., :N]) * x[..., N:]`` in float64."""
    gate, up = x.double().chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


def torch_rms_norm(x, weight, eps):
    """PyTorch's RMSNorm op on ``x``'s dtype."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def torch_manual_rms_norm(x, weight, eps):
    """The formula models write out (FP32 statistics, the normalized rows rounded before the weight)."""
    value = x.float()
    return (value * torch.rsqrt(value.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def torch_silu_and_mul(x):
    """``F.silu(gate) * up`` on ``x``'s dtype."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def ulp(reference, dtype):
    """The spacing of ``dtype`` at each float64 ``reference`` value (subnormal spacing below the normal range)."""
    exponent = torch.floor(torch.log2(reference.abs().clamp_min(2.0 ** MIN_EXPONENT[dtype])))
    return torch.exp2(exponent - MANTISSA_BITS[dtype])


def ulp_errors(out, value):
    """``|out - value|`` of each element in ulps of ``out``'s dtype at the float64 ``value``; NaN counts as infinite."""
    errors = (out.double() - value).abs() / ulp(value, out.dtype)
    return torch.where(torch.isnan(errors), torch.full_like(errors, math.inf), errors)


class GlueReference:
    """A float64 reference [rows, cols] and the error PyTorch's own op made on the same inputs."""

    def __init__(self, value, theirs):
        self.value = value.reshape(-1, value.shape[-1])
        self.torch_error = relative_error(theirs.reshape(self.value.shape), self.value)
        self.bound = 2.0 * self.torch_error + 1e-6

    def check(self, out, label=""):
        """Raise with the worst element's coordinates unless ``out`` is within both bounds; returns its error."""
        out = out.reshape(self.value.shape)
        ours = relative_error(out, self.value)
        ulps = ulp_errors(out, self.value)
        worst = ulps.max().item() if ulps.numel() else 0.0
        if not ours <= self.bound or not worst <= 1.0:
            row, col = divmod(int(ulps.argmax()), self.value.shape[1])
            raise AssertionError(
                f"{label}: relative error {ours:.3g} (bound {self.bound:.3g}, PyTorch {self.torch_error:.3g}), "
                f"worst element {worst:.3g} ulp (bound 1) at [{row}, {col}]: "
                f"{out[row, col].item()} vs {self.value[row, col].item()}"
            )
        return ours
