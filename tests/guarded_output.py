"""Outputs written into a NaN-poisoned slice of a wider buffer, the rest of which must stay NaN."""

import torch


def run_guarded(projection, x, n, out_dtype, *, first_column=8, spare_columns=24):
    """Run into a NaN-poisoned row-slice of a wider buffer; check the guard stayed untouched."""
    batch = x.shape[0]
    buffer = torch.full((batch + 2, n + spare_columns), float("nan"), dtype=out_dtype, device=x.device)
    out = buffer[1 : batch + 1, first_column : first_column + n]
    projection.run(x, out)
    torch.cuda.synchronize()
    guard = buffer.clone()
    guard[1 : batch + 1, first_column : first_column + n] = float("nan")
    assert torch.isnan(guard).all(), "the kernel wrote outside its output"
    return out
