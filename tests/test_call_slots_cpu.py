"""CPU tests for the launch slots (runtime/call_slots.py) against kernels compiled for sm_90a.

Nothing is launched: the compiled functions' own argument marshalling (which needs no GPU) is what the slots are
checked against, and a recorder stands in for the launch.
"""

import ctypes

import pytest
import torch

from decode_projection.kernel.tactic import SplitKTactic
from decode_projection.projection import (
    NO_EPILOGUE, Epilogue, compile_kernel, launch_arguments, launch_value_kinds, launch_values, matrix_view,
    vector_view,
)
from decode_projection.runtime.call_slots import CallSlots

TACTIC = SplitKTactic(64, 16, 2, 8)
WITH_BOTH = Epilogue(residual=True, bias_dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def kernels():
    return {epilogue: compile_kernel(TACTIC, torch.bfloat16, torch.bfloat16, True, epilogue)
            for epilogue in (NO_EPILOGUE, WITH_BOTH)}


def operands(epilogue, rows=5):
    """``(fixed, values)`` for ``epilogue``: the weight's and bias's views and distinct numbers for every value
    (odd pitches, so that no two coincide; nothing is launched)."""
    weight = torch.randn(96, 64, dtype=torch.bfloat16)
    bias = torch.randn(96, dtype=torch.bfloat16) if epilogue.bias_dtype is not None else None
    fixed = (matrix_view(weight), None if bias is None else vector_view(bias))
    values = (0x10000, 0x20000, 0x30000 if epilogue.residual else None, rows, 96, 72, 104, 112 if epilogue.residual
              else 0, 0x40000)
    return fixed, values, (weight, bias)


@pytest.mark.parametrize("epilogue", [NO_EPILOGUE, WITH_BOTH], ids=["plain", "residual-and-bias"])
def test_the_slots_hold_what_the_dsl_would_pass(kernels, epilogue):
    fixed, values, _alive = operands(epilogue)
    slots = CallSlots(fixed, launch_value_kinds(epilogue))
    for slot, value in zip(slots._values, values):
        if slot is not None:
            slot.value = value
    slots.check(kernels[epilogue], launch_arguments(*fixed, values, torch.bfloat16, torch.bfloat16))
    # Any value out of place is caught: the rows in the output's columns' slot.
    swapped = list(values)
    swapped[3], swapped[4] = swapped[4], swapped[3]
    with pytest.raises(RuntimeError, match="passes a compiled function's arguments differently"):
        slots.check(kernels[epilogue], launch_arguments(*fixed, swapped, torch.bfloat16, torch.bfloat16))


def test_slots_of_another_signature_are_refused(kernels):
    fixed, values, _alive = operands(NO_EPILOGUE)
    slots = CallSlots(fixed, launch_value_kinds(WITH_BOTH))  # a residual's slot the kernel does not take
    with pytest.raises(RuntimeError, match="passes a compiled function's arguments differently"):
        slots.launch(kernels[NO_EPILOGUE], values[:2] + (0x30000,) + values[3:],
                     lambda: launch_arguments(*fixed, values, torch.bfloat16, torch.bfloat16))


class Recorder:
    """A compiled function's stand-in: marshals as ``code`` does, records its calls instead of launching."""

    def __init__(self, code):
        self.code, self.calls = code, []

    def generate_execution_args(self, *arguments):
        return self.code.generate_execution_args(*arguments)

    def __call__(self, *arguments):
        self.calls.append(("python", arguments))

    def run_compiled_program(self, addresses):
        self.calls.append(("slots", list(addresses)))


def test_a_kernel_launches_through_python_once_then_through_the_slots(kernels):
    fixed, values, _alive = operands(WITH_BOTH)
    slots = CallSlots(fixed, launch_value_kinds(WITH_BOTH))
    code = Recorder(kernels[WITH_BOTH])
    built = []

    def arguments(values):
        built.append(values)
        return launch_arguments(*fixed, values, torch.bfloat16, torch.bfloat16)

    slots.launch(code, values, lambda: arguments(values))
    later = (0x50000, 0x60000, 0x70000, 7, 96, 80, 120, 128, 0x80000)
    slots.launch(code, later, lambda: arguments(later))
    assert [kind for kind, _ in code.calls] == ["python", "slots"] and built == [values]
    # The second launch hands over the slots, holding its values.
    addresses = code.calls[1][1]
    assert addresses == slots.addresses
    held = [kind.from_address(address).value for kind, address in zip(launch_value_kinds(WITH_BOTH), addresses[2:])]
    assert held == list(later)


def test_launch_values_follow_the_tensors():
    x = torch.randn(1, 100, dtype=torch.bfloat16)
    out = torch.empty(3, 256, dtype=torch.bfloat16)[1:2, :200]
    handle = 0x1234

    def values(x, out, residual):
        torch_stream = type("Stream", (), {"cuda_stream": handle})
        original = torch.cuda.current_stream
        torch.cuda.current_stream = lambda device=None: torch_stream
        try:
            return launch_values(x, out, residual, 200, torch.device("cuda:0"))
        finally:
            torch.cuda.current_stream = original

    # A single row's pitch is its length rounded up to 8 elements, whatever PyTorch reports.
    assert values(x, out, None) == (x.data_ptr(), out.data_ptr(), None, 1, 200, 104, 200, 0, handle)
    x4, out4 = torch.randn(8, 128, dtype=torch.bfloat16)[::2], torch.empty(4, 256, dtype=torch.bfloat16)
    residual = torch.empty(4, 512, dtype=torch.bfloat16)[:, :256]
    assert values(x4, out4, residual) == (x4.data_ptr(), out4.data_ptr(), residual.data_ptr(), 4, 200, 256, 256,
                                          512, handle)
