"""CPU tests of the numerical check every GPU test, the tuner and the benchmark judge outputs with."""

import pytest
import torch

from decode_projection.measure.checks import GatedReference, Reference


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


def truncating_tensor_core_product(x, weight, split=1):
    """A CPU model of wgmma's FP32 accumulation: 16 exact products at a time, the accumulator truncated toward zero
    after each step; split-K partials added in FP32 as the reduction does."""
    k = x.shape[1]
    segment = -(-k // split)
    total = None
    for start in range(0, k, segment):
        acc = torch.zeros(x.shape[0], weight.shape[0], dtype=torch.float64)
        for step in range(start, min(k, start + segment), 16):
            exact = acc + x[:, step : step + 16].double() @ weight[:, step : step + 16].double().T
            rounded = exact.float()
            # Round to nearest overshoots in magnitude half the time: step back toward zero there.
            overshoot = rounded.double().abs() > exact.abs()
            acc = torch.where(overshoot, torch.nextafter(rounded, torch.zeros_like(rounded)), rounded).double()
        total = acc.float() if total is None else total + acc.float()
    return total


@pytest.mark.parametrize("k, split", [(2048, 1), (7168, 1), (7168, 4), (14336, 1)])
def test_a_truncating_fp32_accumulation_passes(k, split):
    """What an honest tensor-core kernel makes must pass, however long its K and however it is split."""
    generator = torch.Generator().manual_seed(k + split)
    x = torch.randn(4, k, generator=generator).bfloat16()
    weight = torch.randn(96, k, generator=generator).bfloat16()
    reference = Reference(x, weight, torch.float32)
    ours = truncating_tensor_core_product(x, weight, split)
    assert reference.check(ours) > 2 * reference.torch_error  # the allowance, not PyTorch's error, lets it pass


def test_the_gated_reference_passes_one_rounding_and_fails_the_wrong_pairing():
    torch.manual_seed(0)
    x, gate, up = (torch.randn(rows, 256).bfloat16() for rows in (8, 64, 64))
    reference = GatedReference(x, gate, up, torch.bfloat16)
    right = (reference.value.float()).bfloat16()  # silu(g) * u in float64, rounded once
    assert reference.check(right, "rounded once") <= reference.bound
    with pytest.raises(AssertionError, match=r"worst element out\[\d+, \d+\]"):
        reference.check(GatedReference(x, up, gate, torch.bfloat16).value.bfloat16(), "gate and up swapped")
    with pytest.raises(AssertionError):
        reference.check(torch.nn.functional.silu(x.double() @ gate.double().T).bfloat16(), "up missing")
