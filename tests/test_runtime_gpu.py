"""GPU tests for the host glue in runtime.py: real device, real driver, real streams."""

import pytest
import torch

from decode_projection import runtime

pytestmark = pytest.mark.gpu


def test_architecture_of_this_gpu():
    assert runtime.architecture(torch.device("cuda")) == "sm_90a"


def test_current_stream_follows_the_torch_stream():
    device = torch.device("cuda", torch.cuda.current_device())
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        assert int(runtime.current_stream(device)) == side.cuda_stream
    assert int(runtime.current_stream(device)) == torch.cuda.current_stream(device).cuda_stream
