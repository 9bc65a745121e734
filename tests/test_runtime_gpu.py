"""GPU tests for the host glue in runtime.py: real device, real driver, real streams."""

import subprocess
import sys

import pytest
import torch
from cuda.bindings import driver

from decode_projection import runtime

pytestmark = pytest.mark.gpu

BF16 = driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
SW128 = driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
L2_128 = driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B  # as weight_map


def test_architecture_of_this_gpu():
    assert runtime.architecture(torch.device("cuda")) == "sm_90a"


def test_current_stream_follows_the_torch_stream():
    device = torch.device("cuda", torch.cuda.current_device())
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        assert int(runtime.current_stream(device)) == side.cuda_stream
    assert int(runtime.current_stream(device)) == torch.cuda.current_stream(device).cuda_stream


def test_tensor_maps_are_aligned_and_hold_the_encoded_bytes():
    weight = torch.randn(300, 520, device="cuda").to(torch.bfloat16)
    pitch = weight.stride(0) * weight.element_size()
    specs = [
        (weight.data_ptr(), BF16, (520, 300), (pitch,), (64, rows), SW128, L2_128)
        for rows in (64, 128)
    ]
    maps = runtime.tensor_maps(specs, weight.device)
    assert maps.dtype == torch.uint8 and maps.numel() == 2 * runtime.TENSOR_MAP_BYTES
    assert maps.data_ptr() % runtime.TENSOR_MAP_ALIGNMENT == 0
    expected = b"".join(runtime.encode_tensor_map(spec) for spec in specs)
    assert bytes(maps.cpu().tolist()) == expected
    assert expected[:128] != expected[128:]


def _fresh_python(code):
    """Run ``code`` in a new interpreter, one that has not touched CUDA yet."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


SPEC = (
    "from cuda.bindings import driver as d\n"
    "from decode_projection import runtime\n"
    "spec = (1 << 20, d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (7168, 2112), (14336,),\n"
    "        (64, 64), d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,\n"
    "        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B)\n"
)


def test_encode_without_a_context_says_so():
    # Measured on an H200: the encoder answers NOT_INITIALIZED before cuInit
    # and INVALID_CONTEXT without a current context, host-only as it is.
    run = _fresh_python(SPEC + "runtime.encode_tensor_map(spec)\n")
    assert run.returncode != 0
    assert "needs a current CUDA context" in run.stderr


def test_tensor_maps_as_the_first_cuda_use():
    run = _fresh_python(SPEC + "import torch\nprint(runtime.tensor_maps([spec], 'cuda').numel())\n")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "128"


def test_a_slot_written_from_a_thread_that_never_used_cuda():
    """The encoder needs a current context, which a new thread has not got until a CUDA runtime call binds it."""
    run = _fresh_python(SPEC + (
        "import threading, torch\n"
        "slot = runtime.tensor_map_slots.take('cuda')\n"
        "def write():\n"
        "    runtime.write_tensor_map(slot, spec)\n"
        "    print(bytes(slot.cpu().tolist()) == runtime.encode_tensor_map(spec), slot.data_ptr() % 128)\n"
        "writer = threading.Thread(target=write)\n"
        "writer.start()\n"
        "writer.join()\n"
    ))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True 0"
