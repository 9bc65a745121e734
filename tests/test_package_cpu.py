"""The package as a library: its exports, version, console script and the reports extra's message."""

import importlib.metadata
import re
import subprocess
import sys

import pytest

import decode_projection
from decode_projection import sass


def test_every_exported_name_resolves():
    for name in decode_projection.__all__:
        assert getattr(decode_projection, name) is not None
    from decode_projection import ProjectionLinear
    from decode_projection.layer import ProjectionLinear as from_the_module

    assert ProjectionLinear is from_the_module
    with pytest.raises(AttributeError):
        decode_projection.not_a_name


def test_importing_the_package_leaves_the_custom_op_unregistered():
    # A second copy of the package in one process (scripts/ab-check) must be able to import too.
    code = "import sys, decode_projection; assert 'decode_projection.layer' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_version_is_a_release_string():
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", decode_projection.__version__)


def test_console_script_target_exists():
    from decode_projection.__main__ import main

    assert callable(main)


def test_missing_nvdisasm_names_the_reports_extra(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    sass.nvdisasm_path.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=re.escape("pip install 'decode-projection[reports]'")):
            sass.nvdisasm_path()
    finally:
        sass.nvdisasm_path.cache_clear()
