"""Shared fixtures: GPU tests are marked ``gpu`` and skip cleanly without CUDA."""

import atexit
import os
import shutil
import tempfile

import pytest
import torch

# Tests compile into a throwaway persistent cache, never the user's.
_cache = tempfile.mkdtemp(prefix="decode_projection_test_cache_")
os.environ["DECODE_PROJECTION_CACHE_DIR"] = _cache
# The tests judge the shipped tables, never tables of the user's own.
os.environ.pop("DECODE_PROJECTION_TABLES", None)
atexit.register(shutil.rmtree, _cache, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper (sm_90a) GPU")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        return
    skip = pytest.mark.skip(reason="needs a Hopper GPU (sm_90a)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
