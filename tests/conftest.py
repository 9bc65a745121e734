"""Shared fixtures: GPU tests are marked ``gpu`` and skip cleanly without CUDA."""

import os
import tempfile

import pytest
import torch

# Tests compile into a throwaway persistent cache, never the user's.
os.environ.setdefault("DECODE_PROJECTION_CACHE_DIR", tempfile.mkdtemp(prefix="decode_projection_test_cache_"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper (sm_90a) GPU")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (Hopper, sm_90a)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
