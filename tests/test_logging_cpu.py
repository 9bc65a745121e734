"""CPU tests of how the library speaks: through ``logging``, configured only by the command line."""

import ast
import logging
from pathlib import Path

import pytest
import torch

import decode_projection
from decode_projection.__main__ import main

PACKAGE = Path(decode_projection.__file__).parent


def test_library_code_logs_and_leaves_configuring_it_to_the_application():
    """Only the command line (``__main__``) prints or configures logging; the library's messages go to
    ``logging.getLogger(__name__)``, shown as the application decides."""
    calls = [
        (f"{path.relative_to(PACKAGE)}:{node.lineno}", node.func)
        for path in sorted(PACKAGE.rglob("*.py")) if path.name != "__main__.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
    ]
    printing = [where for where, called in calls if isinstance(called, ast.Name) and called.id == "print"]
    configuring = [where for where, called in calls
                   if isinstance(called, ast.Attribute) and called.attr in ("basicConfig", "setLevel", "addHandler")]
    assert not printing and not configuring


@pytest.mark.parametrize("flags,level", [([], logging.INFO), (["-v"], logging.DEBUG)])
def test_the_command_line_logs_info_and_with_v_debug(flags, level, monkeypatch, tmp_path):
    package_logger = logging.getLogger("decode_projection")
    monkeypatch.setattr(package_logger, "level", package_logger.level)  # restored after the test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*flags, "tune", "--shape", "2304x1536", "--out", str(tmp_path / "t.json")]) == 2
    assert package_logger.getEffectiveLevel() == level
