"""CPU tests of the numerical check every GPU test, the tuner and the benchmark judge outputs with."""

import pytest
import torch

from decode_projection.checks import Reference


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_outputs_are_held_to_fp32_accuracy(dtype):
    """An FP32 output that went through 16 bits on the way (say, rounded split-K partials) fails."""
    x, weight = torch.randn(8, 2048).to(dtype), torch.randn(300, 2048).to(dtype)
    reference = Reference(x, weight, torch.float32)
    assert reference.bound < 1e-5
    reference.check(torch.matmul(x.float(), weight.float().T))
    with pytest.raises(AssertionError, match=r"worst element out\[\d+, \d+\]"):
        reference.check(torch.matmul(x, weight.T).float())


def test_16_bit_outputs_are_held_to_torch_matmul():
    x, weight = torch.randn(8, 2048).bfloat16(), torch.randn(300, 2048).bfloat16()
    reference = Reference(x, weight, torch.bfloat16)
    assert reference.check(torch.matmul(x, weight.T)) <= reference.bound
    # One element off by about a tenth of a typical output: too little for the norm of 2400, not for the element.
    wrong = torch.matmul(x, weight.T)
    wrong[5, 7] += 4.0
    assert 0 < reference.bound - (wrong.double() - reference.value).norm().item() / reference.value.norm().item()
    with pytest.raises(AssertionError, match=r"out\[5, 7\]"):
        reference.check(wrong)
    nan = torch.matmul(x, weight.T)
    nan[2, 3] = float("nan")
    with pytest.raises(AssertionError, match=r"out\[2, 3\]"):
        reference.check(nan)
