"""Split-K weight projections for LLM decode on NVIDIA Hopper, in the CuTe DSL.

The package's folders: ``runtime`` (DSL and driver glue, compile cache, SASS, GPU numbers), ``kernel`` (the
kernels and their tactics), ``policy`` (heuristic, cost model, tuned tables), ``measure`` (timing, checks,
benchmark, reports) and ``tuning`` (the tuner); the library (``projection``, ``layer``, ``swap``, ``ops``,
``warmup``) and the command line (``__main__``, ``cli_args``) sit at its top level. Modules that moved into a folder
still import by their old names (``MOVED``).

Layers, bottom to top: runtime, kernel, policy, the library, measure, tuning, the command line. A module imports
from its own layer and those below, never from one above (docs/architecture.md says why each module sits where
it does; tests/test_layers_cpu.py checks every import).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from .kernel.activation import silu_and_mul
from .kernel.norm import fused_add_rms_norm, rms_norm
from .kernel.tactic import SplitKTactic
from .projection import PreparedProjection, compile_projection, matrix_view

__version__ = "0.2.0.dev0"

__all__ = [
    "PreparedProjection",
    "ProjectionLinear",
    "SplitKTactic",
    "compile_projection",
    "fused_add_rms_norm",
    "matrix_view",
    "rms_norm",
    "silu_and_mul",
    "swap_linears",
]

# Old name -> where the module lives now. ``decode_projection.splitk`` is the module object
# ``decode_projection.kernel.splitk`` itself (patching one patches the other), imported only when first asked for.
MOVED = {
    "disk_cache": "runtime.disk_cache",
    "gpu": "runtime.gpu",
    "sass": "runtime.sass",
    "sm90": "runtime.sm90",
    "activation": "kernel.activation",
    "norm": "kernel.norm",
    "rowwise": "kernel.rowwise",
    "splitk": "kernel.splitk",
    "tactic": "kernel.tactic",
    "policies": "policy.policies",
    "tables": "policy.tables",
    "workload": "policy.workload",
    "bench": "measure.bench",
    "ceiling": "measure.ceiling",
    "checks": "measure.checks",
    "clocks": "measure.clocks",
    "compile_report": "measure.compile_report",
    "glue": "measure.glue",
    "ops_reference": "measure.ops_reference",
    "report": "measure.report",
    "timing": "measure.timing",
    "candidates": "tuning.candidates",
    "table_tools": "tuning.table_tools",
    "tune": "tuning.tune",
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``<package>.<old name>`` as the moved module itself, so both names hold one module object."""

    def __init__(self, package):
        self.package = package
        self._specs = {}

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        if parent != self.package or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"{self.package}.{MOVED[spec.name.rpartition('.')[2]]}")
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # Already executed under its own name; the import system set the old name's spec on it: give its own back.
        module.__spec__ = self._specs.pop(module.__name__)


# First in line: a folder left behind under an old name (tables/ of an older checkout) must not shadow the module.
sys.meta_path.insert(0, _OldNames(__name__))


def __getattr__(name):
    # The layer is imported on first use: importing it registers the decode_projection::project custom op,
    # which a second copy of the package in the same process (scripts/ab-check) must not register again.
    # The same holds for swap_linears, which builds layers.
    if name == "ProjectionLinear":
        from .layer import ProjectionLinear

        return ProjectionLinear
    if name == "swap_linears":
        from .swap import swap_linears

        return swap_linears
    if name in MOVED:  # decode_projection.tactic without an import statement, as before the folders
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
