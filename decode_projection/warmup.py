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

The jobs are ``(tactic, output dtype, arch, weight dtype, programmatic launch)``:
``kernel_jobs`` lists those the policies of a workload need (the benchmark and
``warm``), ``tactic_jobs`` those of given tactics (the tuner).
"""

import contextlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from tqdm import tqdm

from .policy.policies import resolve_policies
from .projection import compile_projection
from .runtime.disk_cache import writable_cache_dir
from .runtime.gpu import gpu_spec


MOST_WORKERS = 16  # by default: each worker imports torch and the DSL, and 16 already cover ~100 kernels
DEFAULT_WORKERS = min(os.cpu_count() or 1, MOST_WORKERS)
POLICY_KINDS = ("tuned", "heuristic", "batch-invariant")


def policies_for(kind, n, k, batches, device, weight_dtype, output_dtype):
    """``({batch: tactic}, {batch: source})`` for one policy kind (device None: the H200's)."""
    return resolve_policies(
        n, k, batches, gpu=gpu_spec(device), weight_dtype=weight_dtype, output_dtype=output_dtype,
        batch_invariant=kind == "batch-invariant", use_tables=kind != "heuristic",
    )


def tactic_jobs(tactics, output_dtype, arch, weight_dtype, programmatic_launches=(True,)) -> set:
    """The compile job of each of ``tactics`` launched each way in ``programmatic_launches``."""
    return {(tactic, output_dtype, arch, weight_dtype, programmatic)
            for tactic in tactics for programmatic in programmatic_launches}


def kernel_jobs(shapes, batches, kinds, device, arch, weight_dtype, output_dtype, programmatic_launches=(True,)):
    """Every compile job the policies of ``kinds`` need for ``shapes`` at ``batches``."""
    tactics = {tactic for n, k in shapes for kind in kinds
               for tactic in policies_for(kind, n, k, batches, device, weight_dtype, output_dtype)[0].values()}
    return tactic_jobs(tactics, output_dtype, arch, weight_dtype, programmatic_launches)


def _compile_one(job):
    """Worker: compile one kernel into the persistent cache."""
    try:
        compile_projection(*job)
    except Exception:  # compiled again in compile_all, which raises or records the error: a DSL exception
        pass  # need not pickle back to that process, and raising here would stop the pool's other kernels


@contextlib.contextmanager
def compiling_processes(workers=DEFAULT_WORKERS):
    """Worker processes for compile_all to share over several calls (each one imports torch and the DSL once),
    or None where they would not help: one worker, or no disk cache to hand kernels over through."""
    if workers < 2 or writable_cache_dir() is None:
        yield None
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def compile_all(jobs, *, workers=None, progress=True, failed=None, processes=None) -> int:
    """Compile every ``(tactic, output dtype, arch, weight dtype[, programmatic launch])`` job, in parallel
    where a disk cache lets workers hand kernels over, and load them into this process; returns how many loaded.
    ``processes`` (from compiling_processes) compile them, else up to ``workers`` processes started for this call.
    A kernel that does not compile raises, or with ``failed`` (a dict) is recorded there as {job: error}."""
    jobs = sorted(set(jobs), key=str)
    if processes is None:
        with compiling_processes(min(len(jobs), workers or DEFAULT_WORKERS)) as started:
            return _compile_and_load(jobs, started, progress, failed)
    return _compile_and_load(jobs, processes, progress, failed)


def _compile_and_load(jobs, processes, progress, failed) -> int:
    """compile_all's work: the jobs compiled by ``processes`` (if any) into the disk cache, then loaded here."""
    if processes is not None and jobs:
        for _ in tqdm(processes.map(_compile_one, jobs), total=len(jobs), disable=not progress,
                      desc="compile (worker processes)", unit="kernel"):
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
