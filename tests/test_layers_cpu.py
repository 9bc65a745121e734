"""The package's layering (docs/architecture.md): no module imports from a layer above its own.

Every module's imports are read from its source (function bodies too, where the lazy imports are), so a new
import that runs back up a layer fails here whether or not a test happens to execute it.
"""

import ast
from pathlib import Path

import decode_projection

PACKAGE = Path(decode_projection.__file__).parent

# Bottom to top. A folder's modules all sit in its layer; top-level modules are named one by one.
LAYERS = [
    ("runtime", {"runtime/"}),
    ("kernel", {"kernel/"}),
    ("policy", {"policy/"}),
    ("library", {"__init__", "projection", "layer", "swap", "ops", "warmup"}),
    ("measure", {"measure/"}),
    ("tuning", {"tuning/"}),
    ("command line", {"__main__", "cli_args"}),
]


def module_names() -> dict:
    """``{dotted name below the package: path}`` of every module ("" is the package's ``__init__``)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def layer_of(module: str) -> int:
    """The index in LAYERS of a module given by its dotted name below the package."""
    folder = module.partition(".")[0]
    key = f"{folder}/" if module and (PACKAGE / folder).is_dir() else (module or "__init__")
    (index,) = [i for i, (_, members) in enumerate(LAYERS) if key in members] or [None]
    return index


def imports(module: str, path: Path):
    """``(line, imported module)`` for every import of this package's modules in ``path`` (dotted names below
    the package; a name imported from a module resolves to that module)."""
    known = module_names()
    parts = module.split(".") if module else []
    package = parts if path.name == "__init__.py" else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = [decode_projection.__name__, *package[:len(package) - (node.level - 1)]]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            targets = [(name, alias.name) for alias in node.names]
        else:
            continue
        for name, imported in targets:
            if name != decode_projection.__name__ and not name.startswith(f"{decode_projection.__name__}."):
                continue
            below = name.partition(".")[2]
            child = f"{below}.{imported}".lstrip(".") if imported else None
            yield node.lineno, child if child in known else below


def test_every_module_sits_in_one_layer():
    unplaced = [str(path.relative_to(PACKAGE)) for module, path in module_names().items() if layer_of(module) is None]
    assert not unplaced, f"modules no layer names (add them to LAYERS and docs/architecture.md): {unplaced}"


def test_no_import_runs_back_up_a_layer():
    upward = []
    known = module_names()
    for module, path in known.items():
        own = layer_of(module)
        for line, target in imports(module, path):
            if target in known and layer_of(target) > own:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} ({LAYERS[own][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports that run back up a layer:\n" + "\n".join(upward)


def test_the_package_imports_its_modules_by_their_folder_paths():
    """The flat names of decode_projection.MOVED are for users: inside the package they would hide a module's
    layer from this test and its source from the compile cache's fingerprint."""
    known = module_names()
    flat = [f"{path.relative_to(PACKAGE)}:{line} imports {target}"
            for module, path in known.items() for line, target in imports(module, path)
            if target not in known]
    assert not flat, "imports of names that are no module file:\n" + "\n".join(flat)


def test_the_rule_catches_an_upward_import(tmp_path):
    # The test's own reading of imports, on a kernel module that imports the tuner in a function body.
    source = tmp_path / "splitk.py"
    source.write_text("def f():\n    from ..tuning.tune import tune\n")
    found = list(imports("kernel.splitk", source))
    assert found == [(2, "tuning.tune")] and layer_of("tuning.tune") > layer_of("kernel.splitk")
