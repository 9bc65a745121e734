"""A persistent compile cache: compiled kernels saved as object files, loaded on the next start.

Compiling a tactic takes about a second; an inference engine preparing dozens
of projections on every restart should pay that once. ``cute.compile`` never
consults the DSL's own cache, so this one is ours: each compiled kernel is
written with ``dump_to_object`` (an ELF object embedding the sm_90a cubin) and
loaded back with ``cute.runtime.load_module``.

The key covers every input of code generation: the tactic, the dtypes, the
architecture, the CuTe DSL version and a fingerprint of our kernel and compile
sources; change any of them and the old file is simply never looked up again.
Two processes starting together serialize on a per-key file lock, and files
appear by atomic rename, so nobody loads half a file.

Environment: ``DECODE_PROJECTION_CACHE_DIR`` sets the directory (default
``~/.cache/decode_projection``); ``DECODE_PROJECTION_DISK_CACHE=0`` disables it.
"""

import ctypes
import fcntl
import hashlib
import os
import tempfile
from functools import cache
from pathlib import Path

import cutlass
from cutlass.cute.runtime import load_module
from cutlass.runtime import find_runtime_libraries

# The sources whose text decides the generated code.
CODEGEN_SOURCES = ("splitk.py", "tactic.py", "projection.py")
FORMAT = "1"


def cache_dir():
    """The cache directory, or None when the disk cache is disabled."""
    if os.environ.get("DECODE_PROJECTION_DISK_CACHE", "1") == "0":
        return None
    root = os.environ.get("DECODE_PROJECTION_CACHE_DIR") or Path.home() / ".cache" / "decode_projection"
    return Path(root)


@cache
def source_fingerprint() -> str:
    """A hash of the kernel and compile sources."""
    digest = hashlib.sha256()
    for name in CODEGEN_SOURCES:
        digest.update((Path(__file__).with_name(name)).read_bytes())
    return digest.hexdigest()


@cache
def dsl_settings() -> str:
    """The DSL's compile-affecting settings (debug, line info, optimization, runtime library).

    The environment's default ``arch`` is left out: we always pass ours.
    """
    from cutlass.cutlass_dsl import CuTeDSL

    settings = CuTeDSL._get_dsl().envar.cache_key_str().split(";")
    return ";".join(entry for entry in settings if not entry.startswith("arch="))


def cache_key(*codegen_inputs) -> str:
    """The file key of one kernel: its codegen inputs, the DSL version and settings, and our sources."""
    text = repr((FORMAT, cutlass.__version__, dsl_settings(), source_fingerprint(), *codegen_inputs))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@cache
def _load_runtime():
    """Make the DSL runtime's symbols global: objects dumped after a GPU-less compile link against it."""
    for library in find_runtime_libraries(enable_tvm_ffi=False):
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)


def _load(path, prefix):
    """The compiled function stored at ``path``."""
    loaded = load_module(str(path))[prefix]
    loaded.object_file = str(path)  # lets sass.kernel_report disassemble a cached kernel
    return loaded


def _save(directory, path, blob):
    """Write ``blob`` to ``path`` atomically: a complete file or none."""
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(blob)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def cached_compile(compile_fn, *codegen_inputs):
    """``compile_fn()``'s kernel, from the disk cache when present, else compiled and saved.

    A cache that cannot be written (read-only, full) degrades to compiling in
    memory; a damaged file is replaced.
    """
    directory = cache_dir()
    if directory is None:
        return compile_fn()
    key = cache_key(*codegen_inputs)
    prefix = f"decode_projection_{key}"
    path = directory / f"{key}.o"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / f"{key}.lock", "w")
    except OSError:
        return _load(path, prefix) if path.exists() else compile_fn()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            try:
                return _load(path, prefix)
            except Exception:  # a truncated or foreign file: compile again below
                path.unlink()
        _load_runtime()
        compiled = compile_fn()
        try:
            _save(directory, path, compiled.dump_to_object(prefix))
        except OSError:
            return compiled
        return _load(path, prefix)
