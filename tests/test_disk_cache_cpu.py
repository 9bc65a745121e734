"""CPU tests of the persistent compile cache: a sound key, warm starts that compile nothing, safe concurrency."""

import subprocess
import sys

import cutlass
import cutlass.cute as cute
import pytest
import torch

from decode_projection import disk_cache, warmup
from decode_projection.projection import compile_projection
from decode_projection.sass import kernel_report
from decode_projection.tactic import SplitKTactic

TACTIC = SplitKTactic(64, 8, 2, 4)
INPUTS = (TACTIC, "torch.bfloat16", "torch.bfloat16", "sm_90a", True)


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


def test_warm_start_compiles_nothing(cache_dir, monkeypatch):
    cold = compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert len(list(cache_dir.glob("*.o"))) == 1
    compile_projection.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("a warm start compiled a kernel")

    monkeypatch.setattr(cute, "compile", refuse)
    warm = compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert warm.execution_args.signature == cold.execution_args.signature
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
    assert outputs[0] == outputs[1] and "weight_map" in outputs[0]
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

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(type(cache_dir), "iterdir", refuse)
    assert disk_cache.writable_cache_dir() is None


def test_a_kernel_that_does_not_compile_is_raised_or_recorded(cache_dir):
    good = (SplitKTactic(64, 16, 1, 4), torch.bfloat16, "sm_90a", torch.bfloat16)
    bad = (SplitKTactic(64, 16, 2, 4), torch.float16, "sm_90a", torch.bfloat16)  # the kernel writes no FP16
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


def test_saved_files_are_readable_by_whoever_shares_the_cache(cache_dir):
    import os

    umask = os.umask(0o022)
    try:
        compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    finally:
        os.umask(umask)
    (stored,) = cache_dir.glob("*.o")
    assert stored.stat().st_mode & 0o777 == 0o644


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(tmp_path))
    assert disk_cache.cache_dir() == tmp_path
    for off in ("0", "off", "False", "no"):
        monkeypatch.setenv("DECODE_PROJECTION_DISK_CACHE", off)
        assert disk_cache.cache_dir() is None
    monkeypatch.delenv("DECODE_PROJECTION_DISK_CACHE")
    monkeypatch.delenv("DECODE_PROJECTION_CACHE_DIR")

    def homeless():
        raise RuntimeError("Could not determine home directory.")

    # No HOME and a uid without a passwd entry, as in many containers: no default place, so no disk cache.
    monkeypatch.setattr(disk_cache.Path, "home", staticmethod(homeless))
    assert disk_cache.cache_dir() is None
