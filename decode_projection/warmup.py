"""Compile many kernels at once: worker processes fill the persistent cache in parallel.

A projection needs one kernel per distinct tactic, and compiling one takes
about a second of one CPU core; the shipped H200 tuned table holds about a
hundred distinct tactics for the Kimi-K3 shapes, so a first start that compiles
them one by one (``prepare()`` does) waits a minute or two. Compiling them in
worker processes into the disk cache (``disk_cache.py``) first, then loading,
spreads that over the cores (each worker also pays its own imports: measured in
docs/measurements/2026-12-02-warm-cpu.txt). Without a disk cache this process
can write there is nowhere to hand the kernels over, so they are compiled here,
one by one (workers would compile each kernel twice: once there, once here).
"""

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from tqdm import tqdm

from .disk_cache import writable_cache_dir
from .projection import compile_projection


MOST_WORKERS = 16  # by default: each worker imports torch and the DSL, and 16 already cover ~100 kernels


def _compile_one(job):
    """Worker: compile one kernel into the persistent cache."""
    try:
        compile_projection(*job)
    except Exception:  # compiled again in compile_all, which raises or records the error: a DSL exception
        pass  # need not pickle back to that process, and raising here would stop the pool's other kernels


def compile_all(jobs, *, workers=None, progress=True, failed=None) -> int:
    """Compile every ``(tactic, output dtype, arch, weight dtype[, programmatic launch])`` job, in parallel
    where a disk cache lets workers hand kernels over, and load them into this process; returns how many loaded.
    A kernel that does not compile raises, or with ``failed`` (a dict) is recorded there as {job: error}."""
    jobs = sorted(set(jobs), key=str)
    workers = min(len(jobs), workers or min(os.cpu_count() or 1, MOST_WORKERS))
    if workers > 1 and writable_cache_dir() is not None:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for _ in tqdm(pool.map(_compile_one, jobs), total=len(jobs), disable=not progress,
                          desc=f"compile ({workers} processes)", unit="kernel"):
                pass
    loaded = 0
    for job in tqdm(jobs, disable=not progress, desc="load", unit="kernel"):
        try:
            compile_projection(*job)
        except Exception as error:  # whatever the compiler raised, for the caller to report
            if failed is None:
                raise
            failed[job] = error
        else:
            loaded += 1
    return loaded
