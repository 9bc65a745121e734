"""The PDL-aware glue kernel without a GPU: it compiles for sm_90a, waits and lets the next kernel in first."""

import pytest
import torch

from decode_projection.measure.glue import compile_glue, pdl_glue
from decode_projection.runtime.sass import kernel_report


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_glue_waits_then_lets_dependents_launch_before_touching_memory(dtype):
    report = kernel_report(compile_glue(dtype, "sm_90a"))
    assert report.arch == "sm_90a" and report.spills == 0
    opcodes = [line.split()[1] for line in report.sass.splitlines() if line.strip().startswith("/*")]
    # griddepcontrol.wait is ACQBULK in SASS, griddepcontrol.launch_dependents PREEXIT: both before any
    # global load or store, so the previous kernel is done with x before the glue writes it.
    wait, trigger = opcodes.index("ACQBULK"), opcodes.index("PREEXIT")
    memory = [i for i, opcode in enumerate(opcodes) if opcode.startswith(("LDG", "STG"))]
    assert wait < trigger < min(memory)
    # One 16-byte vector in and out per thread.
    assert report.sass.count("LDG.E.128") == report.sass.count("STG.E.128") == 1


@pytest.mark.parametrize("source,x,message", [
    (torch.zeros(2, 16, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16), "one shape and dtype"),
    (torch.zeros(2, 16, dtype=torch.bfloat16), torch.zeros(2, 16, dtype=torch.float16), "one shape and dtype"),
    (torch.zeros(2, 16), torch.zeros(2, 16), "16-bit"),
    (torch.zeros(1, 12, dtype=torch.bfloat16), torch.zeros(1, 12, dtype=torch.bfloat16), "multiple of 8"),
    (torch.zeros(16, 2, dtype=torch.bfloat16).T, torch.zeros(2, 16, dtype=torch.bfloat16), "contiguous"),
    (torch.zeros(2, 16, dtype=torch.bfloat16), torch.zeros(2, 16, dtype=torch.bfloat16), "CUDA device"),
])
def test_the_glue_refuses_what_it_cannot_copy(source, x, message):
    with pytest.raises(ValueError, match=message):
        pdl_glue(source, x)
