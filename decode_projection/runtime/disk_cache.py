"""A persistent compile cache: compiled kernels saved as object files, loaded on the next start.

Compiling a tactic takes about a second; an inference engine preparing dozens
of projections on every restart should pay that once. ``cute.compile`` never
consults the DSL's own cache, so this one is ours: each compiled kernel is
written with ``dump_to_object`` (an ELF object embedding the sm_90a cubin) and
loaded back with ``cute.runtime.load_module``.

The key covers every input of code generation: the tactic, the dtypes, the GPU
architecture, the host CPU architecture (the object holds host code too), the
CuTe DSL version and settings and a fingerprint of every module of this package
that compiling the kernel imports; change any of them and the old file is simply
never looked up again. Two processes starting together serialize on a per-key
file lock (waited for a bounded time), and files appear by atomic rename, so
nobody loads half a file. A file's name carries the hash of its bytes, checked
before loading, so a damaged file is never run; any file that cannot be read,
checked, loaded or written is a miss, compiled in memory: the cache can make a
start slower, never wrong and never failing.

What the cache trusts: only what this user (or root) wrote. Loading an object
runs code from it in this process (the DSL's loader unpickles a signature stored
inside, and links the object's host code), and a hash in a file's name only
catches accidents: anyone can name a file of their own that way. So the
directory is created 0700 and files are written 0600; before loading, the
directory must be a real directory (not a symlink) owned by this user or root
and writable by nobody else, or the cache is refused: one warning, kernels
compiled in memory, nothing read or written there. Each file must likewise be a
regular file, not a symlink (opened with ``O_NOFOLLOW``), owned by this user or
root and writable by nobody else, or it is skipped; its bytes are read once from
that checked descriptor and exactly those bytes are loaded, from memory. Root is
trusted as OpenSSH's StrictModes trusts it: it can change this process anyway.

Environment: ``DECODE_PROJECTION_CACHE_DIR`` sets the directory (default
``~/.cache/decode_projection``; ``~`` is expanded); ``DECODE_PROJECTION_DISK_CACHE``
takes ``1/0``, ``true/false``, ``on/off`` or ``yes/no`` (default on).
"""

import ast
import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import platform
import secrets
import stat
import time
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path

import cutlass
from cutlass.cute.runtime import load_module
from cutlass.runtime import find_runtime_libraries

logger = logging.getLogger(__name__)

FORMAT = "2"  # 2: file names carry the hash of their bytes
SWITCH = "DECODE_PROJECTION_DISK_CACHE"
SWITCH_WORDS = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}
PACKAGE = Path(__file__).parent.parent
# The module that compiles the kernel: it and every module of this package it imports, transitively, are
# inputs of code generation.
COMPILING_MODULE = "projection"
# A compile takes seconds; a holder that keeps the lock longer is stuck or far behind, and compiling here
# costs less than waiting on.
LOCK_WAIT_S = 30.0
LOCK_POLL_S = 0.05
PRIVATE_DIRECTORY, PRIVATE_FILE = 0o700, 0o600
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH

_warned_directories = set()


class Untrusted(Exception):
    """A cache directory or file this process must not load from: its message says why."""


def disk_cache_enabled() -> bool:
    """Whether ``DECODE_PROJECTION_DISK_CACHE`` leaves the disk cache on (unset: on)."""
    value = os.environ.get(SWITCH)
    if value is None:
        return True
    try:
        return SWITCH_WORDS[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{SWITCH}={value!r}: expected 1/0, true/false, on/off or yes/no") from None


def cache_dir():
    """The cache directory, or None when the disk cache is disabled or there is no home to put it in."""
    if not disk_cache_enabled():
        return None
    root = os.environ.get("DECODE_PROJECTION_CACHE_DIR")
    try:
        return Path(root).expanduser() if root else Path.home() / ".cache" / "decode_projection"
    except RuntimeError:  # no HOME and no passwd entry (an arbitrary container uid): no home to expand
        return None


def writable_cache_dir():
    """The cache directory when it is trusted and this process can create files in it and list them, else None."""
    directory = cache_dir()
    if directory is None:
        return None
    with _trusted_directory(directory) as directory_fd:
        if directory_fd is None:
            return None
        try:
            name = _temporary_name("probe")
            os.close(_create_private(directory_fd, name))
            os.unlink(name, dir_fd=directory_fd)
            _listing(directory_fd)  # lookups list the directory: one that cannot be listed finds nothing stored
        except OSError:
            return None
        return directory


def codegen_sources() -> list:
    """The files of every module of this package that compiling the kernel imports, transitively (the package's
    ``__init__`` runs first, whatever is imported, and so does each folder's)."""
    found, pending = set(), [COMPILING_MODULE, ""]
    while pending:
        module = pending.pop()
        if module not in found:
            found.add(module)
            pending.extend(_package_imports(module))
    return sorted(_module_path(module) for module in found)


def _module_path(module):
    """The file of a module of this package by its dotted name below the package ("" is the package itself),
    or None when there is none (a name imported from a module rather than a module)."""
    folder = PACKAGE.joinpath(*module.split(".")) if module else PACKAGE
    for path in (folder / "__init__.py", folder.with_suffix(".py") if module else None):
        if path is not None and path.is_file():
            return path
    return None


def _package_imports(module) -> set:
    """The modules of this package that ``module`` (a dotted name below the package) imports, anywhere in it
    (functions too), with every folder they sit in: importing ``kernel.splitk`` runs ``kernel/__init__.py``."""
    path = _module_path(module)
    parts = module.split(".") if module else []
    package = parts if path.name == "__init__.py" else parts[:-1]  # what a relative import starts from
    dotted = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            dotted += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = [PACKAGE.name, *package[:len(package) - (node.level - 1)]]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # ``from . import x`` and ``from decode_projection import x`` import the module x: any name may be one.
            dotted += [name] + [f"{name}.{alias.name}" for alias in node.names]
    modules = set()
    for name in dotted:
        if name.startswith(f"{PACKAGE.name}."):
            parts = name.split(".")[1:]
            modules.update(".".join(parts[:end]) for end in range(1, len(parts) + 1))
    return {module for module in modules if _module_path(module) is not None}


@cache
def source_fingerprint() -> str:
    """A hash of the names and text of the modules that compiling the kernel imports."""
    digest = hashlib.sha256()
    for path in codegen_sources():
        text = path.read_bytes()
        digest.update(f"{path.relative_to(PACKAGE).as_posix()}\0{len(text)}\0".encode() + text)
    return digest.hexdigest()


# The settings the DSL 4.8 keys its compiles on (EnvironmentVarManager.cache_key_str) that 4.7 has, for 4.7.
DSL_47_SETTINGS = ("auto_m2s", "compiler_opt", "debug", "dryrun", "enable_assertions", "enable_pyir", "enable_tvm_ffi",
                   "lineinfo", "loc_tracebacks", "shared_libs", "tolerate_m2m", "warnings_as_errors")


@cache
def dsl_settings() -> str:
    """The DSL's compile-affecting settings (debug, line info, optimization, runtime library).

    The environment's default ``arch`` is left out: we always pass ours.
    """
    from cutlass.cutlass_dsl import CuTeDSL

    envar = CuTeDSL._get_dsl().envar
    if hasattr(envar, "cache_key_str"):
        settings = envar.cache_key_str().split(";")
    else:  # the DSL 4.7 lists none
        settings = [f"{name}={getattr(envar, name)!r}" for name in DSL_47_SETTINGS]
    return ";".join(entry for entry in settings if not entry.startswith("arch="))


def cache_key(*codegen_inputs) -> str:
    """The file key of one kernel: its codegen inputs, the host CPU, the DSL version and settings, and our sources."""
    text = repr((FORMAT, platform.machine(), cutlass.__version__, dsl_settings(), source_fingerprint(),
                 *codegen_inputs))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@cache
def _load_runtime():
    """Make the DSL runtime's symbols global: objects dumped after a GPU-less compile link against it."""
    for library in find_runtime_libraries(enable_tvm_ffi=False):
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)


def _warn_once(directory, message):
    """Log a warning about the cache at ``directory`` unless one was logged for it already."""
    if str(directory) not in _warned_directories:
        _warned_directories.add(str(directory))
        logger.warning("compile cache %s: %s", directory, message)


def _owner(status) -> int:
    """The uid owning a file: the ownership check's one input, where tests stand in another user without root."""
    return status.st_uid


def _check_trusted(status, is_kind, kind):
    """Raise ``Untrusted`` unless ``status`` is a ``kind`` (no symlink) of this user or root, writable by it only."""
    if stat.S_ISLNK(status.st_mode):
        raise Untrusted(f"a symbolic link, not a {kind}")
    if not is_kind(status.st_mode):
        raise Untrusted(f"not a {kind}")
    if _owner(status) not in (os.geteuid(), 0):
        raise Untrusted(f"owned by uid {_owner(status)}, not by this user (uid {os.geteuid()}) or root")
    if status.st_mode & OTHERS_WRITE:
        raise Untrusted(f"writable by group or others (mode {stat.S_IMODE(status.st_mode):04o})")


def _open_trusted_directory(directory) -> int:
    """A descriptor of ``directory``, created 0700 where missing; raises ``Untrusted`` or ``OSError``."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):
        os.mkdir(directory, PRIVATE_DIRECTORY)
    _check_trusted(os.lstat(directory), stat.S_ISDIR, "directory")  # says "symlink" where opening says ENOTDIR
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_trusted(os.fstat(directory_fd), stat.S_ISDIR, "directory")  # what was opened, swapped in or not
    except Untrusted:
        os.close(directory_fd)
        raise
    return directory_fd


@contextmanager
def _trusted_directory(directory):
    """Yield a descriptor of the cache directory, or None (warned once) where it cannot be made or trusted."""
    try:
        directory_fd = _open_trusted_directory(directory)
    except (Untrusted, OSError) as problem:
        reason = (problem.strerror or problem) if isinstance(problem, OSError) else problem
        _warn_once(directory, f"not used ({reason}); kernels are compiled in memory")
        yield None
        return
    try:
        yield directory_fd
    finally:
        os.close(directory_fd)


def _listing(directory_fd) -> list:
    """The names in the cache directory."""
    return os.listdir(directory_fd)


def _read_trusted(directory_fd, name) -> bytes:
    """The bytes of the file ``name``, read once from a descriptor checked to be trusted; raises ``Untrusted``."""
    try:
        # O_NONBLOCK: a FIFO planted under the name must not hang the open.
        file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Untrusted("a symbolic link, not a file") from None
        raise
    try:
        _check_trusted(os.fstat(file_fd), stat.S_ISREG, "regular file")
        with open(file_fd, "rb", closefd=False) as file:
            return file.read()
    finally:
        os.close(file_fd)


@contextmanager
def _memory_path(blob):
    """Yield a path naming a copy of ``blob`` in this process's memory: the loader takes only a path, and this one
    no other process can change between the check and the load."""
    memory_fd = os.memfd_create("decode_projection_kernel", os.MFD_CLOEXEC)
    try:
        with open(memory_fd, "wb", closefd=False) as file:
            file.write(blob)
        path = f"/proc/self/fd/{memory_fd}"
        if not os.path.exists(path):  # no /proc: nothing to load through, which is no fault of the file
            raise FileNotFoundError(errno.ENOENT, "no /proc to load kernels from memory", path)
        yield path
    finally:
        os.close(memory_fd)


def _load(blob, prefix, path):
    """The compiled function in object bytes ``blob``; ``path`` is where they are stored."""
    with _memory_path(blob) as memory_path:
        loaded = load_module(memory_path)[prefix]
    loaded.object_file = str(path)  # lets sass.kernel_report disassemble a cached kernel
    return loaded


def _stored_name(key, blob):
    """The file name of ``blob`` stored under ``key``: the key, then a hash of the bytes."""
    return f"{key}-{hashlib.sha256(blob).hexdigest()[:16]}.o"


def _remove(directory_fd, name):
    """Remove ``name`` from the cache directory if it can be."""
    with suppress(OSError):
        os.unlink(name, dir_fd=directory_fd)


def _load_stored(directory, directory_fd, key, prefix, may_write):
    """The kernel stored under ``key`` in a trusted file whose bytes match its name, else None.

    A file that fails its hash or does not load is removed where the key's lock is held (``may_write``); another
    user's file, a symlink or one others may write is skipped, never read past its checks.
    """
    try:
        names = sorted(name for name in _listing(directory_fd) if name.startswith(f"{key}-") and name.endswith(".o"))
    except OSError:
        return None
    for name in names:
        try:
            blob = _read_trusted(directory_fd, name)
        except Untrusted as problem:
            _warn_once(directory, f"{name} skipped ({problem})")
            continue
        except OSError:
            continue
        if name == _stored_name(key, blob):
            try:
                loaded = _load(blob, prefix, directory / name)
            except OSError:  # this process cannot load from memory: a miss, the file left for others
                continue
            except Exception:  # intact, and fails to load where the key says it should: it would fail every start
                logger.debug("%s in %s does not load", name, directory, exc_info=True)
            else:
                logger.debug("loaded %s from the compile cache %s", name, directory)
                return loaded
        if may_write:
            _remove(directory_fd, name)
    return None


def _temporary_name(name) -> str:
    """A fresh name to write ``name``'s bytes under before renaming them in place."""
    return f"{name}.{secrets.token_hex(8)}.tmp"


def _create_private(directory_fd, name) -> int:
    """A descriptor of a new file ``name`` in the cache directory, private to this user (0600)."""
    file_fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE,
                      dir_fd=directory_fd)
    os.fchmod(file_fd, PRIVATE_FILE)  # the mode given to open is masked by the umask, which may take the owner's
    return file_fd


def _save(directory_fd, name, blob):
    """Store ``blob`` as ``name`` atomically: a complete file or none."""
    temporary = _temporary_name(name)
    file_fd = _create_private(directory_fd, temporary)
    try:
        with open(file_fd, "wb", closefd=False) as file:
            file.write(blob)
        os.fsync(file_fd)
        os.replace(temporary, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    except BaseException:
        _remove(directory_fd, temporary)
        raise
    finally:
        os.close(file_fd)


def _lock_within(lock_fd, seconds) -> bool:
    """Take the exclusive lock on ``lock_fd`` within ``seconds``; whether it was taken (or locks are unsupported)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL_S)
        except OSError:  # a file system without locks: atomic renames still keep files whole
            return True


@contextmanager
def _key_lock(directory, directory_fd, key):
    """Hold the per-key lock; yield whether this process may write and remove the key's files.

    Not where the lock file cannot be opened, nor after waiting ``LOCK_WAIT_S`` on another holder.
    """
    try:
        lock_fd = os.open(f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE,
                          dir_fd=directory_fd)
    except OSError:
        yield False
        return
    try:
        locked = _lock_within(lock_fd, LOCK_WAIT_S)
        if not locked:
            _warn_once(directory, f"{key}.lock held by another process for over {LOCK_WAIT_S:.0f} s; "
                                  "compiling in memory")
        yield locked
    finally:
        os.close(lock_fd)  # releases the lock


def _compile_and_store(compile_fn, directory, directory_fd, key, prefix):
    """``compile_fn()``'s kernel, stored under ``key``, loaded back from its object bytes where that works."""
    _load_runtime()
    compiled = compile_fn()
    blob = compiled.dump_to_object(prefix)
    name = _stored_name(key, blob)
    try:
        loaded = _load(blob, prefix, directory / name)
    except Exception:  # an object that does not load here is not stored: it would fail every start
        logger.debug("compiled %s does not load from its object; not stored", prefix, exc_info=True)
        return compiled
    try:
        _save(directory_fd, name, blob)
    except OSError as error:  # full or read-only: the kernel compiled here still runs
        _warn_once(directory, f"cannot store kernels ({error.strerror}); they are compiled on every start")
        return compiled
    logger.debug("compiled %s into the compile cache %s", name, directory)
    return loaded


def cached_compile(compile_fn, *codegen_inputs):
    """``compile_fn()``'s kernel, from the disk cache when present, else compiled and saved.

    A cache that is refused or cannot be written degrades to compiling in memory; a damaged file is replaced.
    """
    directory = cache_dir()
    if directory is None:
        return _compile_in_memory(compile_fn, codegen_inputs)
    key = cache_key(*codegen_inputs)
    prefix = f"decode_projection_{key}"
    with _trusted_directory(directory) as directory_fd:
        if directory_fd is None:
            return _compile_in_memory(compile_fn, codegen_inputs)
        with _key_lock(directory, directory_fd, key) as may_write:
            loaded = _load_stored(directory, directory_fd, key, prefix, may_write)
            if loaded is not None:
                return loaded
            if not may_write:
                return _compile_in_memory(compile_fn, codegen_inputs)
            return _compile_and_store(compile_fn, directory, directory_fd, key, prefix)


def _compile_in_memory(compile_fn, codegen_inputs):
    """``compile_fn()``'s kernel, kept out of the disk cache."""
    logger.debug("compiling %s in memory", codegen_inputs)
    return compile_fn()
