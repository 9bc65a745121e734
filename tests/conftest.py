"""Shared fixtures: GPU tests are marked ``gpu`` and skip cleanly without CUDA."""

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper (sm_90a) GPU")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (Hopper, sm_90a)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
