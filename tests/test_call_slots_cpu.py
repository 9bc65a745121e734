"""CPU tests for the launch slots (runtime/call_slots.py) against kernels compiled for sm_90a: the projection's
and the glue ops'.

Nothing is launched: the compiled functions' own argument marshalling (which needs no GPU) is what the slots are
checked against, and a recorder stands in for the compiled function wherever a launch would happen.
"""

import ctypes
import inspect
import types

import pytest
import torch
from cuda.bindings import driver

from decode_projection.kernel import activation, norm, rowwise
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


def held_values(kinds, slots):
    """What the slots hold after the fixed arguments, one per kind (None where the kind is None)."""
    addresses = iter(slots.addresses[len(slots.addresses) - sum(kind is not None for kind in kinds):])
    return tuple(None if kind is None else kind.from_address(next(addresses)).value for kind in kinds)


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
    assert held_values(kinds, slots) == later


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


# ---------------------------------------------------------------- the glue ops' slots

BF16 = torch.bfloat16
STREAM = 0x7F00_0009_0000
GLUE_VARIANTS = [pytest.param(False, id="rms_norm"), pytest.param(True, id="fused_add_rms_norm"),
                 pytest.param(None, id="silu_and_mul")]


def glue_kernel(fused, dtype=BF16):
    """``(compiled, kinds)`` of the norm (``fused`` a bool) or of SiLU-and-mul (``fused`` None)."""
    if fused is None:
        return activation.compile_silu_and_mul(dtype, "sm_90a"), activation.VALUE_KINDS
    return norm.compile_rms_norm(dtype, fused, "sm_90a"), norm.value_kinds(fused)


def distinct_glue_values(kinds, salt=0):
    """Values of ``kinds`` no two alike: 16-byte aligned addresses, 64-bit pitches with high bytes set (so a narrower
    C value shows), eps not a round number; nothing launched with them."""
    values = []
    for place, kind in enumerate(kinds[:-1]):
        if kind is None:
            values.append(None)
        elif kind is ctypes.c_void_p:
            values.append(0x7F00_0001_0000 + 0x1_0000 * place + 16 * salt)
        elif kind is ctypes.c_float:
            values.append(1.25e-6 * (1 + salt))
        else:
            values.append(5 + 8 * place + salt + (0x1_0000_0000 * place if kind is ctypes.c_int64 else 0))
    return kinds._make([*values, STREAM + salt])


def glue_arguments(kinds, values):
    return rowwise.dsl_arguments(kinds, values, BF16, driver.CUstream(values.stream))


def test_the_glue_values_are_the_entry_points_arguments_in_order():
    for entry, values in ((norm.RMSNorm.__call__, norm.NormValues), (activation.SiluAndMul.__call__,
                                                                       activation.SiluValues)):
        assert list(inspect.signature(entry).parameters) == ["self", *values._fields]


def test_placeholders_are_of_each_kind_and_none_where_there_is_no_argument():
    values = rowwise.placeholder_values(norm.value_kinds(False))
    assert values.residual is values.residual_out is None and values.x == 0
    assert values.rows == values.x_pitch == 1 and isinstance(values.eps, float)


@pytest.mark.parametrize("fused", GLUE_VARIANTS)
def test_the_glue_slots_hold_what_the_dsl_would_pass(fused):
    code, kinds = glue_kernel(fused)
    values = distinct_glue_values(kinds)
    slots = CallSlots((), kinds)
    slots.write(values)
    slots.check(code, glue_arguments(kinds, values))
    # Any value out of place is caught: the rows in the width's place, one pitch in another's; the norm's eps is
    # compared to the bit.
    pitches = [name for name in kinds._fields if name.endswith("pitch")]
    wrong = [values._replace(rows=values.width, width=values.rows),
             values._replace(**{pitches[0]: getattr(values, pitches[1]), pitches[1]: getattr(values, pitches[0])})]
    if "eps" in kinds._fields:
        wrong.append(values._replace(eps=values.eps * (1 + 2**-20)))
    for wrong_values in wrong:
        with pytest.raises(RuntimeError, match="passes a compiled function's arguments differently"):
            slots.check(code, glue_arguments(kinds, wrong_values))


@pytest.fixture
def glue_launches(monkeypatch):
    """The glue ops on CPU tensors as on one Hopper GPU, each compiled kernel behind a recorder (which the compile
    functions then give); returns the recorders by their kernel's id."""
    monkeypatch.setattr(rowwise, "architecture", lambda device: "sm_90a")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=STREAM))
    # A CPU tensor's device has no index: as the current device, it is the one the launch is on.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    monkeypatch.setattr(rowwise, "_launchers", {})
    recorders = {}

    def recorded(compile_function):
        def compile_and_record(dtype, *variant):
            code = compile_function(dtype, *variant)
            return recorders.setdefault(id(code), Recorder(code))
        return compile_and_record

    monkeypatch.setattr(norm, "compile_rms_norm", recorded(norm.compile_rms_norm))
    monkeypatch.setattr(activation, "compile_silu_and_mul", recorded(activation.compile_silu_and_mul))
    return recorders


def test_glue_ops_launch_through_python_once_then_through_the_slots(glue_launches):
    wide, weight = torch.randn(6, 96, dtype=BF16), torch.randn(64, dtype=BF16)
    x, residual = torch.randn(4, 64, dtype=BF16), torch.randn(4, 64, dtype=BF16)
    # Each op twice, the second time on other tensors, extents and pitches, in place or not. The first launch
    # checks the DSL's own marshalling against the slots (Recorder.generate_execution_args); the second must leave
    # its own values in them.
    norm.rms_norm(x, weight, 1e-5)
    out = norm.rms_norm(wide[1:4, 16:80], weight, 1e-6, out=wide[1:4, 16:80])
    norm.fused_add_rms_norm(x, residual, weight)
    norm.fused_add_rms_norm(wide[:1, :64], residual[:1], weight, 2e-6, out=wide[:1, :64], residual_out=residual[:1])
    gate_up = torch.randn(3, 128, dtype=BF16)
    activation.silu_and_mul(x)
    activated = activation.silu_and_mul(gate_up, out=torch.empty(3, 96, dtype=BF16)[:, 16:80])
    eps = {value: ctypes.c_float(value).value for value in (1e-6, 2e-6)}  # as a C float holds them
    expected = {
        False: (wide.data_ptr() + 2 * (96 + 16), weight.data_ptr(), out.data_ptr(), None, None, 3, 64, 96, 96, 0, 0,
                eps[1e-6], STREAM),
        True: (wide.data_ptr(), weight.data_ptr(), wide.data_ptr(), residual.data_ptr(), residual.data_ptr(), 1, 64,
               64, 64, 64, 64, eps[2e-6], STREAM),
        None: (gate_up.data_ptr(), gate_up.data_ptr() + 2 * 64, activated.data_ptr(), 3, 64, 128, 96, STREAM),
    }
    assert len(glue_launches) == len(expected)
    for fused, values in expected.items():
        recorder, kinds = glue_kernel(fused)  # the compile functions give the recorders here
        slots = rowwise._launchers[id(recorder)].slots
        assert [kind for kind, _ in recorder.calls] == ["python", "slots"]
        assert recorder.calls[1][1] == slots.addresses
        assert held_values(kinds, slots) == values


def test_a_glue_kernel_bound_to_one_device_is_refused_on_another(monkeypatch):
    monkeypatch.setattr(rowwise, "_launchers", {})
    code, kinds = glue_kernel(None)
    recorder = Recorder(code)
    values = distinct_glue_values(kinds)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    rowwise.launch("silu_and_mul", recorder, torch.device("cuda", 0), kinds, values, BF16)
    with pytest.raises(ValueError, match="silu_and_mul already runs on cuda:0; glue ops on several GPUs"):
        rowwise.launch("silu_and_mul", recorder, torch.device("cuda", 1), kinds, values, BF16)
    assert [kind for kind, _ in recorder.calls] == ["python"]
