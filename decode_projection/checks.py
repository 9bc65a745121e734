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


class Reference:
    """float64 ``x @ weight^T`` and the error bound torch.matmul sets on the same inputs."""

    def __init__(self, x, weight, out_dtype):
        self.value = x.double() @ weight.double().T
        self.torch_error = relative_error(torch.matmul(x, weight.T).to(out_dtype), self.value)
        # Both accumulate in FP32 and round once to the output dtype.
        self.bound = 2.0 * self.torch_error + 1e-6

    def check(self, out, label=""):
        """Raise with the worst element's coordinates unless ``out`` is within the bound; returns its error."""
        ours = relative_error(out, self.value)
        if not torch.isfinite(out).all() or not ours <= self.bound:
            row, col, got, want = worst_element(out, self.value)
            raise AssertionError(
                f"{label}: relative error {ours:.3g} > bound {self.bound:.3g} (torch.matmul "
                f"{self.torch_error:.3g}); worst element out[{row}, {col}] = {got} vs {want}"
            )
        return ours


def assert_close_to_reference(out, x, weight, *, label=""):
    """Judge ``out`` against float64 ``x @ weight^T``, relative to torch.matmul's own error."""
    return Reference(x, weight, out.dtype).check(out, label)
