"""CPU tests for the launch slots (runtime/call_slots.py) against kernels compiled for sm_90a.

Nothing is launched: the compiled functions' own argument marshalling (which needs no GPU) is what the slots are
checked against, and a recorder stands in for the compiled function wherever a launch would happen.
"""

import inspect

import pytest
import torch

from decode_projection.kernel.launch import VALUE_KINDS, LaunchValues, SplitKLaunch
from decode_projection.kernel.tactic import SplitKTactic
from decode_projection.projection import (
    NO_EPILOGUE, Epilogue, compile_kernel, launch_arguments, launch_value_kinds, launch_values, matrix_view,
    vector_view,
)
from decode_projection.runtime.call_slots import CallSlots

TACTIC = SplitKTactic(64, 16, 2, 8)
WITH_BOTH = Epilogue(residual=True, bias_dtype=torch.bfloat16)
EPILOGUES = [pytest.param(NO_EPILOGUE, id="plain"), pytest.param(WITH_BOTH, id="residual-and-bias")]


@pytest.fixture(scope="module")
def kernels():
    return {epilogue: compile_kernel(TACTIC, torch.bfloat16, torch.bfloat16, True, epilogue)
            for epilogue in (NO_EPILOGUE, WITH_BOTH)}


def prepared(epilogue):
    """``(fixed, tensors)``: the weight's and the bias's views for ``epilogue``, and the tensors they view."""
    weight = torch.randn(96, 64, dtype=torch.bfloat16)
    bias = torch.randn(96, dtype=torch.bfloat16) if epilogue.bias_dtype is not None else None
    return (matrix_view(weight), None if bias is None else vector_view(bias)), (weight, bias)


def distinct_values(epilogue, salt=0):
    """``LaunchValues`` no two alike, the 64-bit ones with high bytes set (so a narrower C value shows), nothing
    launched with them."""
    return LaunchValues(0x7F00_0001_0000 + salt, 0x7F00_0002_0000 + salt,
                        0x7F00_0003_0000 + salt if epilogue.residual else None, 5 + salt, 96 + salt,
                        0x1_0000_0048 + salt, 0x2_0000_0068 + salt, 0x3_0000_0070 + salt if epilogue.residual else 0,
                        0x7F00_0004_0000 + salt)


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


def test_the_launch_values_are_the_entry_points_arguments_in_order():
    parameters = list(inspect.signature(SplitKLaunch.__call__).parameters)
    assert parameters == ["self", "weight", "bias", *LaunchValues._fields]


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_the_slots_hold_what_the_dsl_would_pass(kernels, epilogue):
    fixed, _alive = prepared(epilogue)
    values = distinct_values(epilogue)
    slots = CallSlots(fixed, launch_value_kinds(epilogue))
    slots.write(values)
    slots.check(kernels[epilogue], launch_arguments(*fixed, values, torch.bfloat16, torch.bfloat16))
    # Any value out of place is caught: the batch in the output rows' place, a pitch in another's.
    for swapped in (values._replace(batch=values.output_rows, output_rows=values.batch),
                    values._replace(activation_pitch=values.out_pitch, out_pitch=values.activation_pitch)):
        with pytest.raises(RuntimeError, match="passes a compiled function's arguments differently"):
            slots.check(kernels[epilogue], launch_arguments(*fixed, swapped, torch.bfloat16, torch.bfloat16))


def test_slots_of_another_signature_are_refused(kernels):
    fixed, _alive = prepared(NO_EPILOGUE)
    values = distinct_values(NO_EPILOGUE)
    slots = CallSlots(fixed, VALUE_KINDS)  # a residual's slot the kernel does not take
    code = Recorder(kernels[NO_EPILOGUE])
    with pytest.raises(RuntimeError, match="passes a compiled function's arguments differently"):
        slots.launch(code, values._replace(residual=0x7F00_0003_0000),
                     lambda: launch_arguments(*fixed, values, torch.bfloat16, torch.bfloat16))
    assert code.calls == []


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_a_kernel_launches_through_python_once_then_through_the_slots(kernels, epilogue):
    fixed, _alive = prepared(epilogue)
    kinds = launch_value_kinds(epilogue)
    slots = CallSlots(fixed, kinds)
    code = Recorder(kernels[epilogue])
    built = []

    def arguments(values):
        built.append(values)
        return launch_arguments(*fixed, values, torch.bfloat16, torch.bfloat16)

    first, later = distinct_values(epilogue), distinct_values(epilogue, salt=8)
    slots.launch(code, first, lambda: arguments(first))
    slots.launch(code, later, lambda: arguments(later))
    assert [kind for kind, _ in code.calls] == ["python", "slots"] and built == [first]
    # The second launch hands over the slots' addresses, the slots holding its values.
    assert code.calls[1][1] == slots.addresses
    fixed_places = len(slots.addresses) - sum(kind is not None for kind in kinds)
    held = [kind.from_address(address).value
            for kind, address in zip([k for k in kinds if k is not None], slots.addresses[fixed_places:])]
    assert held == [value for kind, value in zip(kinds, later) if kind is not None]


def test_launch_values_follow_the_tensors(monkeypatch):
    handle = 0x1234
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("Stream", (), {"cuda_stream": handle}))
    device = torch.device("cuda:0")
    x = torch.randn(1, 100, dtype=torch.bfloat16)
    out = torch.empty(3, 256, dtype=torch.bfloat16)[1:2, :200]
    # A single row's pitch is its length rounded up to 8 elements, whatever PyTorch reports.
    assert launch_values(x, out, None, 200, device) == (x.data_ptr(), out.data_ptr(), None, 1, 200, 104, 200, 0,
                                                        handle)
    x4, out4 = torch.randn(8, 128, dtype=torch.bfloat16)[::2], torch.empty(4, 256, dtype=torch.bfloat16)
    residual = torch.empty(4, 512, dtype=torch.bfloat16)[:, :256]
    assert launch_values(x4, out4, residual, 256, device) == (x4.data_ptr(), out4.data_ptr(), residual.data_ptr(),
                                                              4, 256, 256, 256, 512, handle)
