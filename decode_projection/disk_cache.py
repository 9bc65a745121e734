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
appear by atomic rename, so nobody loads half a file. A file's name carries the
hash of its bytes, checked before loading, so a damaged file is never run; any
file that cannot be read, checked, loaded or written is a miss, compiled in
memory: the cache can make a start slower, never wrong and never failing.

Environment: ``DECODE_PROJECTION_CACHE_DIR`` sets the directory (default
``~/.cache/decode_projection``); ``DECODE_PROJECTION_DISK_CACHE=0`` (or ``off``,
``false``, ``no``) disables it.
"""

import ctypes
import fcntl
import hashlib
import os
import tempfile
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import cutlass
from cutlass.cute.runtime import load_module
from cutlass.runtime import find_runtime_libraries

# The sources whose text decides the generated code.
CODEGEN_SOURCES = ("splitk.py", "tactic.py", "sm90.py", "projection.py")
FORMAT = "2"  # 2: file names carry the hash of their bytes
DISABLED = ("0", "off", "false", "no")


def cache_dir():
    """The cache directory, or None when the disk cache is disabled."""
    if os.environ.get("DECODE_PROJECTION_DISK_CACHE", "1").strip().lower() in DISABLED:
        return None
    root = os.environ.get("DECODE_PROJECTION_CACHE_DIR")
    if root:
        return Path(root)
    try:
        return Path.home() / ".cache" / "decode_projection"
    except RuntimeError:  # no HOME and no passwd entry (an arbitrary container uid): no default place
        return None


def writable_cache_dir():
    """The cache directory when this process can create files in it and list them, else None."""
    directory = cache_dir()
    if directory is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
        next(directory.iterdir(), None)  # lookups glob the directory: one it cannot list finds nothing stored
        return directory
    except OSError:
        return None


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


def _stored_name(key, blob):
    """The file name of ``blob`` stored under ``key``: the key, then a hash of the bytes."""
    return f"{key}-{hashlib.sha256(blob).hexdigest()[:16]}.o"


def _load_stored(directory, key, prefix, writable):
    """The kernel stored under ``key`` whose bytes match its name, else None; a damaged file is removed where
    the key's lock is held (``writable``)."""
    try:
        stored = sorted(directory.glob(f"{key}-*.o"))
    except OSError:
        return None
    for path in stored:
        try:
            intact = path.name == _stored_name(key, path.read_bytes())
            if intact:
                return _load(path, prefix)
        except Exception:  # unreadable, or an intact file this process cannot load: a miss, left in place
            continue
        if writable:
            try:
                path.unlink()
            except OSError:
                pass
    return None


def _umask() -> int:
    """This process's umask, read without changing it where the system says (another thread may be creating files)."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
        return umask


def _save(directory, path, blob):
    """Write ``blob`` to ``path`` atomically, readable as a plainly created file would be: a complete file or none."""
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(blob)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600: other users sharing the cache could not read it
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


@contextmanager
def _key_lock(directory, key):
    """Hold the per-key file lock where the directory allows one; yield whether it does."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / f"{key}.lock", "w")
    except OSError:
        yield False
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: atomic renames still keep files whole
            pass
        yield True


def cached_compile(compile_fn, *codegen_inputs):
    """``compile_fn()``'s kernel, from the disk cache when present, else compiled and saved.

    A cache that cannot be written (read-only, full, shared) degrades to compiling in
    memory; a damaged file is replaced.
    """
    directory = cache_dir()
    if directory is None:
        return compile_fn()
    key = cache_key(*codegen_inputs)
    prefix = f"decode_projection_{key}"
    with _key_lock(directory, key) as writable:
        loaded = _load_stored(directory, key, prefix, writable)
        if loaded is not None:
            return loaded
        _load_runtime()
        compiled = compile_fn()
        if not writable:
            return compiled
        blob = compiled.dump_to_object(prefix)
        path = directory / _stored_name(key, blob)
        try:
            _save(directory, path, blob)
            return _load(path, prefix)
        except Exception:  # full, read-only or shared: the kernel compiled here still runs
            return compiled
