"""CPU tests of the persistent compile cache: a sound key, warm starts that compile nothing, safe concurrency,
and nothing loaded that another user could have written."""

import base64
import logging
import os
import pickle
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import load_module

from decode_projection import warmup
from decode_projection.kernel.tactic import SplitKTactic
from decode_projection.projection import compile_projection
from decode_projection.runtime import disk_cache
from decode_projection.runtime.sass import kernel_report

TACTIC = SplitKTactic(64, 8, 2, 4)
INPUTS = (TACTIC, "torch.bfloat16", "torch.bfloat16", "sm_90a", True)
NOBODY = 65534
ROOT = os.geteuid() == 0


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(tmp_path))
    compile_projection.cache_clear()
    yield tmp_path
    compile_projection.cache_clear()


def test_key_changes_with_every_codegen_input(monkeypatch):
    base = disk_cache.cache_key(*INPUTS)
    assert disk_cache.cache_key(*INPUTS) == base
    variants = [
        (SplitKTactic(64, 8, 2, 5), *INPUTS[1:]),
        (TACTIC, "torch.float32", *INPUTS[2:]),
        (*INPUTS[:2], "torch.float16", *INPUTS[3:]),
        (*INPUTS[:3], "sm_100a", True),
        (*INPUTS[:4], False),  # launched without programmatic dependent launch
    ]
    keys = {disk_cache.cache_key(*inputs) for inputs in variants}
    assert len(keys) == len(variants) and base not in keys
    monkeypatch.setattr(cutlass, "__version__", "9.9.9")
    assert disk_cache.cache_key(*INPUTS) != base
    monkeypatch.undo()
    monkeypatch.setattr(disk_cache, "source_fingerprint", lambda: "edited kernel")
    assert disk_cache.cache_key(*INPUTS) != base
    monkeypatch.undo()
    # The object holds host code: a cache on storage shared by x86-64 and aarch64 hosts keeps one file each.
    other_host = "aarch64" if platform.machine() != "aarch64" else "x86_64"
    monkeypatch.setattr(platform, "machine", lambda: other_host)
    assert disk_cache.cache_key(*INPUTS) != base


def test_the_fingerprint_covers_every_module_compiling_imports():
    # A fresh process imports only what compiling a kernel needs (with the cache off, it really compiles).
    script = (
        "import sys, torch; from decode_projection.projection import compile_projection; "
        "compile_projection((64, 16, 4, 4), torch.bfloat16, 'sm_90a'); "
        "print(*(module.__file__ for name, module in list(sys.modules.items()) "
        "if name.startswith('decode_projection.')), sep='\\n')"
    )
    env = {**os.environ, "DECODE_PROJECTION_DISK_CACHE": "0"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    imported = {Path(line).resolve() for line in run.stdout.split()}
    fingerprinted = {path.resolve() for path in disk_cache.codegen_sources()}
    assert {"splitk.py", "tactic.py", "projection.py"} <= {path.name for path in imported}
    assert imported <= fingerprinted, f"left out of the fingerprint: {sorted(imported - fingerprinted)}"


def test_warm_start_compiles_nothing(cache_dir, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger=disk_cache.__name__)
    cold = compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert len(list(cache_dir.glob("*.o"))) == 1
    compile_projection.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("a warm start compiled a kernel")

    monkeypatch.setattr(cute, "compile", refuse)
    warm = compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert warm.execution_args.signature == cold.execution_args.signature
    assert any("loaded" in record.message and record.levelno == logging.DEBUG for record in caplog.records)
    assert kernel_report(warm).utmaldg > 0
    # A different tactic is a miss, and would have to compile; so is the launch without programmatic launch.
    with pytest.raises(AssertionError, match="compiled a kernel"):
        compile_projection(SplitKTactic(64, 8, 1, 4), torch.bfloat16, "sm_90a")
    with pytest.raises(AssertionError, match="compiled a kernel"):
        compile_projection(TACTIC, torch.bfloat16, "sm_90a", torch.bfloat16, False)


def test_disabled_cache_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("DECODE_PROJECTION_DISK_CACHE", "0")
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert not list(cache_dir.iterdir())


def test_two_processes_starting_together(cache_dir):
    script = (
        "import torch; from decode_projection.projection import compile_projection; "
        "print(compile_projection((64, 16, 4, 4), torch.bfloat16, 'sm_90a').execution_args.signature)"
    )
    env = {**__import__("os").environ, "DECODE_PROJECTION_CACHE_DIR": str(cache_dir)}
    runs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs)
    assert outputs[0] == outputs[1] and "stream" in outputs[0]
    assert len(list(cache_dir.glob("*.o"))) == 1
    assert not list(cache_dir.glob("*.tmp"))


def test_damaged_file_is_replaced(cache_dir):
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    (stored,) = cache_dir.glob("*.o")
    stored.write_bytes(stored.read_bytes()[:1000])
    compile_projection.cache_clear()
    again = compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert kernel_report(again).utmaldg > 0
    assert stored.stat().st_size > 1000


def test_unwritable_cache_compiles_in_memory(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(blocked / "cache"))
    compile_projection.cache_clear()
    code = compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert kernel_report(code).utmaldg > 0
    compile_projection.cache_clear()


def test_key_includes_dsl_settings(monkeypatch):
    settings = disk_cache.dsl_settings()
    assert "lineinfo=" in settings and "arch=" not in settings
    base = disk_cache.cache_key(*INPUTS)
    monkeypatch.setattr(disk_cache, "dsl_settings", lambda: settings.replace("lineinfo=False", "lineinfo=True"))
    assert disk_cache.cache_key(*INPUTS) != base


def test_parallel_warmup_hands_every_kernel_over_through_the_cache(cache_dir, monkeypatch):
    jobs = [(SplitKTactic(64, 16, 1, 4), torch.bfloat16, "sm_90a", torch.bfloat16),
            (SplitKTactic(128, 16, 2, 4), torch.float32, "sm_90a", torch.bfloat16)]

    def refuse(*args, **kwargs):
        raise AssertionError("the warm-up process compiled a kernel itself")

    # Workers are fresh processes: this process only loads what they wrote.
    monkeypatch.setattr(cute, "compile", refuse)
    assert warmup.compile_all(jobs + jobs[:1], workers=2, progress=False) == 2
    assert len(list(cache_dir.glob("*.o"))) == 2
    assert all(kernel_report(compile_projection(*job)).hgmma > 0 for job in jobs)


def test_warmup_into_an_unwritable_cache_compiles_each_kernel_once(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.delenv("DECODE_PROJECTION_DISK_CACHE", raising=False)  # a disabled cache would pass vacuously
    jobs = [(SplitKTactic(64, 16, 1, 4), torch.bfloat16, "sm_90a", torch.bfloat16),
            (SplitKTactic(128, 16, 2, 4), torch.float32, "sm_90a", torch.bfloat16)]

    def refuse(*args, **kwargs):
        raise AssertionError("workers compiled into a cache nobody can read back: every kernel compiles twice")

    monkeypatch.setattr(warmup, "ProcessPoolExecutor", refuse)
    compile_projection.cache_clear()
    assert warmup.compile_all(jobs, workers=2, progress=False) == 2
    assert all(kernel_report(compile_projection(*job)).hgmma > 0 for job in jobs)
    compile_projection.cache_clear()


def test_a_cache_that_cannot_be_listed_is_not_writable(cache_dir, monkeypatch):
    assert disk_cache.writable_cache_dir() == cache_dir

    def refuse(directory_fd):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(disk_cache, "_listing", refuse)
    assert disk_cache.writable_cache_dir() is None


def test_a_kernel_that_does_not_compile_is_raised_or_recorded(cache_dir):
    good = (SplitKTactic(64, 16, 1, 4), torch.bfloat16, "sm_90a", torch.bfloat16)
    bad = (SplitKTactic(64, 16, 2, 4), torch.float64, "sm_90a", torch.bfloat16)  # the kernel writes no FP64
    with pytest.raises(ValueError, match="output dtype"):
        warmup.compile_all([good, bad], workers=1, progress=False)
    failed = {}
    # Through worker processes too: a worker's failure neither stops the others nor needs to pickle.
    assert warmup.compile_all([good, bad], workers=2, progress=False, failed=failed) == 1
    assert list(failed) == [bad] and isinstance(failed[bad], ValueError)


def test_a_flipped_byte_is_never_loaded(cache_dir):
    cold = kernel_report(compile_projection(TACTIC, torch.bfloat16, "sm_90a")).sass
    (stored,) = cache_dir.glob("*.o")
    damaged = bytearray(stored.read_bytes())
    damaged[6000] ^= 0x40  # inside the kernel's code: it would still load, as other code
    stored.write_bytes(bytes(damaged))
    compile_projection.cache_clear()
    assert kernel_report(compile_projection(TACTIC, torch.bfloat16, "sm_90a")).sass == cold
    (replaced,) = cache_dir.glob("*.o")
    assert replaced.read_bytes() != bytes(damaged)


def test_a_damaged_file_where_no_lock_can_be_taken_is_compiled_in_memory(cache_dir):
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    (stored,) = cache_dir.glob("*.o")
    stored.write_bytes(stored.read_bytes()[:1000])
    (lock,) = cache_dir.glob("*.lock")
    lock.unlink()
    lock.mkdir()  # opening the lock now fails, as in a read-only or another user's cache
    compile_projection.cache_clear()
    assert kernel_report(compile_projection(TACTIC, torch.bfloat16, "sm_90a")).utmaldg > 0


def test_the_cache_is_private_to_its_user(tmp_path, monkeypatch):
    cache_dir = tmp_path / "new" / "cache"
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(cache_dir))
    compile_projection.cache_clear()
    umask = os.umask(0o022)
    try:
        compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    finally:
        os.umask(umask)
        compile_projection.cache_clear()
    (stored,) = cache_dir.glob("*.o")
    (lock,) = cache_dir.glob("*.lock")
    assert cache_dir.stat().st_mode & 0o777 == 0o700
    assert stored.stat().st_mode & 0o777 == 0o600 and lock.stat().st_mode & 0o777 == 0o600


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(tmp_path))
    assert disk_cache.cache_dir() == tmp_path
    for off in ("0", "off", "False", " no\n", "FALSE"):
        monkeypatch.setenv("DECODE_PROJECTION_DISK_CACHE", off)
        assert disk_cache.cache_dir() is None
    for on in ("1", "on", "True", " YES "):
        monkeypatch.setenv("DECODE_PROJECTION_DISK_CACHE", on)
        assert disk_cache.cache_dir() == tmp_path
    # Anything else is a mistake worth stopping for: "2", "disable" or "nope" leaving the cache on would hide it.
    for unclear in ("2", "disable", "nope", ""):
        monkeypatch.setenv("DECODE_PROJECTION_DISK_CACHE", unclear)
        with pytest.raises(ValueError, match="DECODE_PROJECTION_DISK_CACHE"):
            disk_cache.cache_dir()
    monkeypatch.delenv("DECODE_PROJECTION_DISK_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", "~/kernels")
    assert disk_cache.cache_dir() == tmp_path / "kernels"
    monkeypatch.delenv("DECODE_PROJECTION_CACHE_DIR")

    def homeless():
        raise RuntimeError("Could not determine home directory.")

    # No HOME and a uid without a passwd entry, as in many containers: no default place, so no disk cache.
    monkeypatch.setattr(disk_cache.Path, "home", staticmethod(homeless))
    assert disk_cache.cache_dir() is None


# What the cache trusts: nothing another user could have written or could change.


def count_compiles(monkeypatch):
    """A list that grows by one on every ``cute.compile`` from now on (which still compiles)."""
    calls, real = [], cute.compile

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(cute, "compile", counted)
    return calls


def cache_warnings(caplog):
    """The warnings the disk cache logged."""
    return [record.getMessage() for record in caplog.records
            if record.name == disk_cache.__name__ and record.levelno == logging.WARNING]


def make_foreign(path, monkeypatch, how="chown" if ROOT else "patched"):
    """Make the file at ``path`` another user's: really (as root), or as the ownership check reads it."""
    if how == "chown":
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        return
    inode, owner = path.lstat().st_ino, disk_cache._owner
    monkeypatch.setattr(disk_cache, "_owner", lambda status: NOBODY if status.st_ino == inode else owner(status))


def test_a_directory_others_can_write_is_never_used(cache_dir, monkeypatch, caplog):
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    before = sorted(cache_dir.iterdir())
    cache_dir.chmod(0o777)
    compile_projection.cache_clear()
    compiles = count_compiles(monkeypatch)
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    compile_projection(SplitKTactic(64, 16, 1, 4), torch.bfloat16, "sm_90a")
    assert len(compiles) == 2, "a kernel was loaded from a directory anyone can write"
    assert sorted(cache_dir.iterdir()) == before, "a kernel was written where anyone can replace it"
    assert disk_cache.writable_cache_dir() is None  # warm-up workers cannot hand kernels over through it
    (warning,) = cache_warnings(caplog)  # once for the directory, not once per kernel
    assert str(cache_dir) in warning and "writable by group or others" in warning


@pytest.mark.parametrize("how", ["chown", "patched"])
def test_a_file_of_another_user_is_never_loaded(cache_dir, monkeypatch, caplog, how):
    if how == "chown" and not ROOT:
        pytest.skip("giving a file to another user needs root")
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    (stored,) = cache_dir.glob("*.o")
    make_foreign(stored, monkeypatch, how)
    compile_projection.cache_clear()
    compiles = count_compiles(monkeypatch)
    assert kernel_report(compile_projection(TACTIC, torch.bfloat16, "sm_90a")).utmaldg > 0
    assert len(compiles) == 1
    (warning,) = cache_warnings(caplog)
    assert stored.name in warning and f"uid {NOBODY}" in warning


def test_a_symlinked_directory_is_never_used(tmp_path, monkeypatch, caplog):
    real = tmp_path / "real"
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(real))
    compile_projection.cache_clear()
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    before = sorted(real.iterdir())
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(link))
    compile_projection.cache_clear()
    compiles = count_compiles(monkeypatch)
    try:
        compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    finally:
        compile_projection.cache_clear()
    assert len(compiles) == 1 and sorted(real.iterdir()) == before
    (warning,) = cache_warnings(caplog)
    assert "symbolic link" in warning


def test_a_symlinked_file_is_never_followed(cache_dir, monkeypatch, caplog, tmp_path_factory):
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    (stored,) = cache_dir.glob("*.o")
    elsewhere = tmp_path_factory.mktemp("elsewhere") / stored.name
    stored.rename(elsewhere)
    stored.symlink_to(elsewhere)
    compile_projection.cache_clear()
    compiles = count_compiles(monkeypatch)
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert len(compiles) == 1
    assert not stored.is_symlink(), "the kernel compiled again replaces the link with a file of its own"
    (warning,) = cache_warnings(caplog)
    assert stored.name in warning and "symbolic link" in warning


def test_a_lock_held_by_another_process_does_not_hang(cache_dir, monkeypatch):
    lock = cache_dir / f"{disk_cache.cache_key(*INPUTS)}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; lock = open(sys.argv[1], 'a'); "
         "fcntl.flock(lock, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(disk_cache, "LOCK_WAIT_S", 0.5)
        started = time.monotonic()
        assert kernel_report(compile_projection(TACTIC, torch.bfloat16, "sm_90a")).utmaldg > 0
        assert time.monotonic() - started < 60, "waited on the holder instead of compiling"
    finally:
        holder.kill()
        holder.wait()
    assert not list(cache_dir.glob("*.o")), "wrote a kernel without holding the key's lock"


def signature_that_runs(blob, marker):
    """``blob``, an object dumped by the DSL, with its pickled signature replaced by one whose unpickling creates
    ``marker``: the same length, so the object still links."""

    class Creates:
        def __reduce__(self):
            return exec, (f"open({str(marker)!r}, 'w').close()",)

    def replace(match):
        length = len(base64.b64decode(match.group(1)))
        return base64.b64encode(pickle.dumps(Creates(), protocol=4).ljust(length, b"\0")) + b"\0"

    # The signature is a base64 pickle (protocol 4: "gAS...") ending in a NUL.
    planted = re.sub(rb"(gAS[A-Za-z0-9+/]+={0,2})\0", replace, blob, count=1)
    assert planted != blob and len(planted) == len(blob)
    return planted


def test_a_planted_object_never_runs(cache_dir, monkeypatch, tmp_path_factory):
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    (genuine,) = cache_dir.glob("*.o")
    marker = tmp_path_factory.mktemp("marker") / "ran"
    planted_bytes = signature_that_runs(genuine.read_bytes(), marker)
    key = disk_cache.cache_key(*INPUTS)
    # The planted object is a working exploit: loaded the DSL's way, its signature runs code.
    outside = tmp_path_factory.mktemp("outside") / genuine.name
    outside.write_bytes(planted_bytes)
    with pytest.raises(Exception):
        load_module(str(outside))[f"decode_projection_{key}"]
    assert marker.exists()
    marker.unlink()

    genuine.unlink()
    planted = cache_dir / disk_cache._stored_name(key, planted_bytes)  # named as the cache names a file
    planted.write_bytes(planted_bytes)
    planted.chmod(0o600)
    make_foreign(planted, monkeypatch)
    compile_projection.cache_clear()
    assert kernel_report(compile_projection(TACTIC, torch.bfloat16, "sm_90a")).utmaldg > 0
    assert not marker.exists(), "a planted object ran code in this process"
    # The kernel compiled instead is stored next to it, and it is what the next start loads, whatever the order.
    compile_projection.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("the user's own stored kernel was not loaded")

    monkeypatch.setattr(cute, "compile", refuse)
    compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert not marker.exists() and len(list(cache_dir.glob("*.o"))) == 2


def test_an_intact_file_that_does_not_load_is_removed(cache_dir):
    key = disk_cache.cache_key(*INPUTS)
    junk = b"not an object file"
    unloadable = cache_dir / disk_cache._stored_name(key, junk)  # its name matches its bytes
    unloadable.write_bytes(junk)
    unloadable.chmod(0o600)
    assert kernel_report(compile_projection(TACTIC, torch.bfloat16, "sm_90a")).utmaldg > 0
    assert not unloadable.exists(), "it would fail to load on every start"
    assert len(list(cache_dir.glob("*.o"))) == 1
