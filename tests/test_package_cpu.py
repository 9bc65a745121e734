"""The package as a library: its exports, old import paths, version, console script and the reports extra's message."""

import importlib
import importlib.metadata
import re
import subprocess
import sys

import pytest

import decode_projection
from decode_projection.runtime import sass


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


@pytest.mark.parametrize("old,new", sorted(decode_projection.MOVED.items()))
def test_an_old_import_path_is_the_moved_module_itself(old, new, monkeypatch):
    """``decode_projection.<old>`` (from before the folders) and ``decode_projection.<folder>.<module>`` are one
    module object, however it is reached, so patching either name patches what the package runs."""
    moved = importlib.import_module(f"decode_projection.{new}")
    assert importlib.import_module(f"decode_projection.{old}") is moved
    assert sys.modules[f"decode_projection.{old}"] is moved and getattr(decode_projection, old) is moved
    exec(f"from decode_projection import {old} as by_name\nassert by_name is moved", {"moved": moved})
    assert moved.__name__ == moved.__spec__.name == f"decode_projection.{new}"
    monkeypatch.setattr(sys.modules[f"decode_projection.{old}"], "patched_by_old_name", True, raising=False)
    assert moved.patched_by_old_name


def test_old_import_paths_import_nothing_until_asked():
    code = (
        "import sys, decode_projection\n"
        "assert 'decode_projection.tuning.tune' not in sys.modules and 'decode_projection.tune' not in sys.modules\n"
        "from decode_projection.tune import tune\n"
        "assert sys.modules['decode_projection.tune'] is sys.modules['decode_projection.tuning.tune']\n"
        "assert decode_projection.candidates is sys.modules['decode_projection.tuning.candidates']\n"
        "assert 'decode_projection.layer' not in sys.modules\n"
    )
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
