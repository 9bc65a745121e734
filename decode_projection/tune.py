"""Autotuner: time the cost model's best candidates on the GPU and keep the fastest.

For each (N, K, padded batch) the tuner takes the heuristic's pick plus the
tactics the cost model ranks best (``candidate_tactics``), checks each one's
output against a float64 reference (judged against torch.matmul's own error)
before it may win, and times it with cold L2 and CUDA-graph replay twice:
back to back (each launch's weight prefetch overlaps the previous launch, as in
a chain of projections with programmatic dependent launch) and after a foreign
kernel (as after a norm or an activation, where nothing overlaps). The winner
has the best mean of the two: a tactic that only wins by overlapping itself
would leave a model with glue between its projections slower. Pruning is
what makes a full table fit in minutes of GPU time: the tactic space has
hundreds of valid points, the model keeps a handful.

Batch-invariant tables tune batch 1 freely and then pin its summation order
(split and K boxes per stage) for every other batch, so a row is summed in the
same order whatever the batch.
"""

import datetime
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import astuple
from pathlib import Path

import cutlass
import torch
from tqdm import tqdm

from .checks import Reference
from .disk_cache import cache_dir
from .policies import candidate_tactics, gpu_spec
from .projection import PreparedProjection, compile_projection
from .runtime import architecture
from .tables import dtype_name, write_table
from .timing import cold_copies, foreign_kernel, graph_time_us


def tune_shape(n, k, batches, *, weight_dtype, output_dtype, batch_invariant, limit, progress, timings=None):
    """Tuned entries (dicts) for one weight shape; every candidate's time goes to ``timings`` if given."""
    device = torch.device("cuda", torch.cuda.current_device())
    gpu = gpu_spec(device)
    copies = cold_copies(n * k * 2, device)
    glue = foreign_kernel(device)
    glue_us = graph_time_us(lambda i: glue(), copies, repeats=7)
    weights = [torch.randn(n, k, device=device).to(weight_dtype) for _ in range(copies)]
    entries, pinned = [], None
    for batch in sorted(batches):
        x = torch.randn(batch, k, device=device).to(weight_dtype)
        outs = [torch.empty(batch, n, device=device, dtype=output_dtype) for _ in range(copies)]
        reference = Reference(x, weights[0], output_dtype)
        timed = []
        for tactic in candidate_tactics(n, k, batch, gpu, limit=limit, order=pinned):
            projections = [PreparedProjection(w, {batch: tactic}, output_dtype=output_dtype).prepare() for w in weights]
            outs[0].fill_(float("nan"))
            projections[0].run(x, outs[0])
            reference.check(outs[0], label=f"{n}x{k} M={batch} {tactic}")

            def launch(i, projections=projections):
                projections[i].run(x, outs[i])

            chained = graph_time_us(launch, copies, repeats=7)
            alone = graph_time_us(launch, copies, repeats=7, separator=glue, separator_us=glue_us)
            timed.append(((chained + alone) / 2, tactic, chained, alone))
            progress.update()
        best_us, best, _, _ = min(timed, key=lambda row: row[0])
        if timings is not None:
            timings.append({"n": n, "k": k, "batch": batch, "batch_invariant": batch_invariant,
                            "timed": [[list(astuple(tactic)), round(chained, 3), round(alone, 3)]
                                      for _, tactic, chained, alone in timed]})
        if batch_invariant and pinned is None:
            pinned = best.summation_order
        entries.append({
            "gpu": gpu.name, "sm_count": gpu.sm_count, "n": n, "k": k,
            "weight_dtype": dtype_name(weight_dtype), "output_dtype": dtype_name(output_dtype),
            "batch_invariant": batch_invariant, "batch": batch,
            "tactic": [best.weight_rows, best.activation_rows, best.split, best.stages, best.k_boxes],
            "us": round(best_us, 3),  # mean of back to back and after glue
        })
    return entries


def _compile_one(args):
    """Worker: compile one kernel into the persistent cache."""
    compile_projection(*args)


def precompile(shapes, batches, *, output_dtype, weight_dtype, limit):
    """Compile every candidate up front, in parallel worker processes, so timing never waits on the compiler.

    Workers write to the persistent compile cache; the tuning process then loads
    from it. Without a disk cache the kernels are compiled here, one by one.
    """
    arch = architecture(torch.device("cuda", torch.cuda.current_device()))
    gpu = gpu_spec(torch.cuda.current_device())
    jobs = sorted(
        {
            (tactic, output_dtype, arch, weight_dtype)
            for n, k in shapes
            for batch in batches
            for tactic in candidate_tactics(n, k, batch, gpu, limit=limit)
        },
        key=str,
    )
    workers = min(len(jobs), os.cpu_count() or 1)
    if cache_dir() is not None and workers > 1:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for _ in tqdm(pool.map(_compile_one, jobs), total=len(jobs), desc=f"compile ({workers} processes)"):
                pass
    for job in tqdm(jobs, desc="load", unit="kernel"):
        compile_projection(*job)


def tune(shapes, batches, *, weight_dtype=torch.bfloat16, output_dtype=torch.bfloat16,
         batch_invariant=False, limit=8, out_path=None, timings_path=None):
    """Tune every (shape, batch); returns the entries and writes them as a table (and every
    candidate's time as JSON) if asked."""
    started = time.perf_counter()
    precompile(shapes, batches, output_dtype=output_dtype, weight_dtype=weight_dtype, limit=limit)
    entries, timings = [], []
    total = len(shapes) * len(batches) * limit
    with tqdm(total=total, desc="tune", unit="tactic") as progress:
        for n, k in shapes:
            shape_started = time.perf_counter()
            entries += tune_shape(
                n, k, batches, weight_dtype=weight_dtype, output_dtype=output_dtype,
                batch_invariant=batch_invariant, limit=limit, progress=progress, timings=timings,
            )
            progress.write(f"{n}x{k}: {time.perf_counter() - shape_started:.1f} s")
            if out_path is not None:  # after every shape, so an interrupted run keeps what it measured
                write_table(out_path, entries, dsl_version=cutlass.__version__,
                            measured=datetime.date.today().isoformat())
            if timings_path is not None:
                Path(timings_path).write_text(json.dumps(timings, indent=0) + "\n")
    print(f"tuned {len(shapes)} shapes x {len(batches)} batches in {time.perf_counter() - started:.0f} s")
    return entries
