"""Numerical checks against a float64 reference, shared by the tests, the tuner and the benchmark.

An output passes when its relative Frobenius error against float64 ``x @ weight^T`` is at most twice what
PyTorch's own product of the same inputs in the same output dtype makes, and so is its worst element's error,
each plus an allowance for summing K in FP32 on tensor cores: wgmma adds 16 products at a time and truncates its
FP32 accumulator rather than rounding it (Fasi et al. 2021 measured this up to the A100; we assume Hopper's alike),
so its error grows with K/16 steps and with how K is split, which differs between our tactics and cuBLAS's. The
allowance, K/16 ulps of FP32 (5e-5 at K = 14336; at least 1e-6, and 1e-5 of the largest output for an element),
is 2-3x what truncating after every step makes in a CPU model of it (tests/test_checks_cpu.py), and 30x below what
a kernel that loses precision on the way makes (split-K partials rounded to BF16: 1.7e-3). The element bound catches a single wrong element that
the norm of a large output would hide.
"""

import torch


def relative_error(value, reference):
    """Relative Frobenius error of ``value`` against a float64 ``reference``."""
    diff = value.double() - reference
    return (diff.norm() / reference.norm()).item()


def largest_error(value, reference):
    """Largest absolute error of ``value`` against a float64 ``reference``."""
    return (value.double() - reference).abs().max().item()


def worst_element(value, reference):
    """(row, col, value, reference) of the largest absolute error, for failure messages."""
    diff = (value.double() - reference).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    flat = int(diff.argmax())
    row, col = divmod(flat, reference.shape[1])
    return row, col, value[row, col].item(), reference[row, col].item()


def torch_product(x, weight, out_dtype):
    """PyTorch's ``x @ weight^T`` in ``out_dtype``: 16-bit outputs as torch.matmul rounds them, FP32 unrounded."""
    if out_dtype != torch.float32:
        return torch.matmul(x, weight.T).to(out_dtype)
    # torch.matmul of 16-bit inputs rounds to 16 bits, which would loosen an FP32 bound about 10^4-fold.
    if x.is_cuda:
        return torch.mm(x, weight.T, out_dtype=torch.float32)  # cuBLAS's tensor-core GEMM with an FP32 output
    return torch.matmul(x.float(), weight.float().T)  # the CPU has no 16-bit GEMM with an FP32 output


def accumulation_allowance(k):
    """Relative error that summing ``k`` products in FP32 on tensor cores may add: one FP32 ulp per 16 of them."""
    return k / 16 * 2.0**-24


class Reference:
    """float64 ``x @ weight^T`` (plus ``addend``, an epilogue's bias and residual broadcast to the output) and the
    error bound PyTorch sets on the same inputs: with an addend, its FP32 product plus the addend, rounded once."""

    def __init__(self, x, weight, out_dtype, addend=None):
        self.value = x.double() @ weight.double().T
        if addend is None:
            theirs = torch_product(x, weight, out_dtype)
        else:
            self.value = self.value + addend.double()
            theirs = (torch_product(x, weight, torch.float32) + addend.float()).to(out_dtype)
        self.set_bounds(theirs, x.shape[1])

    def set_bounds(self, theirs, k):
        """The bounds PyTorch's ``theirs`` sets on ``self.value``, with the allowance for summing ``k`` products."""
        self.torch_error = relative_error(theirs, self.value)
        allowance = accumulation_allowance(k)
        self.bound = 2.0 * self.torch_error + max(1e-6, allowance)
        self.torch_worst = largest_error(theirs, self.value)
        self.element_bound = 2.0 * self.torch_worst + max(1e-5, allowance) * self.value.abs().max().item()

    def check(self, out, label=""):
        """Raise with the worst element's coordinates unless ``out`` is within both bounds; returns its error."""
        ours, worst = relative_error(out, self.value), largest_error(out, self.value)
        if not torch.isfinite(out).all() or not ours <= self.bound or not worst <= self.element_bound:
            row, col, got, want = worst_element(out, self.value)
            raise AssertionError(
                f"{label}: relative error {ours:.3g} (bound {self.bound:.3g}, torch.matmul {self.torch_error:.3g}), "
                f"worst element error {worst:.3g} (bound {self.element_bound:.3g}, torch.matmul "
                f"{self.torch_worst:.3g}); worst element out[{row}, {col}] = {got} vs {want}"
            )
        return ours


class GatedReference(Reference):
    """float64 ``silu(x @ gate^T) * (x @ up^T)`` and the bounds PyTorch sets: ``F.silu`` of its FP32 gate product
    times its FP32 up product, rounded once."""

    def __init__(self, x, gate, up, out_dtype):
        gated, upped = x.double() @ gate.double().T, x.double() @ up.double().T
        self.value = gated * torch.sigmoid(gated) * upped
        products = torch_product(x, gate, torch.float32), torch_product(x, up, torch.float32)
        self.set_bounds((torch.nn.functional.silu(products[0]) * products[1]).to(out_dtype), x.shape[1])


def assert_close_to_reference(out, x, weight, *, label="", addend=None):
    """Judge ``out`` against float64 ``x @ weight^T`` (``+ addend``), relative to PyTorch's own error."""
    return Reference(x, weight, out.dtype, addend).check(out, label)
