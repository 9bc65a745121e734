"""Numerical checks against a float64 reference, shared by the tests, the tuner and the benchmark."""

import torch


def relative_error(value, reference):
    """Relative Frobenius error of ``value`` against a float64 ``reference``."""
    diff = value.double() - reference
    return (diff.norm() / reference.norm()).item()


def worst_element(value, reference):
    """(row, col, value, reference) of the largest absolute error, for failure messages."""
    diff = (value.double() - reference).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    flat = int(diff.argmax())
    row, col = divmod(flat, reference.shape[1])
    return row, col, value[row, col].item(), reference[row, col].item()


def assert_close_to_reference(out, x, weight, *, label=""):
    """Judge ``out`` against float64 ``x @ weight^T``, relative to torch.matmul's own error."""
    reference = x.double() @ weight.double().T
    ours = relative_error(out, reference)
    torch_error = relative_error(torch.matmul(x, weight.T).to(out.dtype), reference)
    # Both accumulate in FP32 and round once to the output dtype.
    bound = 2.0 * torch_error + 1e-6
    if not torch.isfinite(out).all() or not ours <= bound:
        row, col, got, want = worst_element(out, reference)
        raise AssertionError(
            f"{label}: relative error {ours:.3g} > bound {bound:.3g} (torch.matmul {torch_error:.3g}); "
            f"worst element out[{row}, {col}] = {got} vs {want}"
        )
    return ours
