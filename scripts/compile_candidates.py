"""Compile for sm_90a every tactic a re-tune of some shapes would time, before spending device time on it.

The tactics are the tuner's: each cell's free candidates with the shipped tables as incumbents
(``tune.free_candidates``), then those the batch-invariant pass times in the shape's shipped order
(``tune.chosen_order_candidates``). Each kernel is compiled and its SASS checked: wgmma (HGMMA) and TMA loads
(UTMALDG) present, no local-memory spills. One line per kernel, then a summary; exit status 1 if any fails.
A kernel serves every K, so each distinct tactic is compiled once.

    python scripts/compile_candidates.py --shape 2112x7168 --shape 3584x7168 --candidates 16 --workers 2
"""

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from decode_projection.cli_args import batch_list, positive_int, shape
from decode_projection.policy.tables import invariant_orders, shipped_tables
from decode_projection.policy.workload import DECODE_BATCHES
from decode_projection.runtime.gpu import H200, KNOWN_GPUS
from decode_projection.tuning.tune import chosen_order_candidates, free_candidates

BF16 = torch.bfloat16


def retune_tactics(shapes, batches, *, limit, invariant_limit, gpu=H200) -> set:
    """Every tactic a re-tune of ``shapes`` on ``gpu`` (BF16, shipped orders pinned) would compile."""
    kinds = {"weight_dtype": BF16, "output_dtype": BF16}
    orders = invariant_orders(gpu, shapes, BF16, BF16)
    found = set()
    for n, k in shapes:
        for batch in batches:
            found.update(free_candidates(n, k, batch, gpu, limit=limit, incumbents=shipped_tables(), kinds=kinds))
            if (n, k) in orders:
                found.update(chosen_order_candidates(n, k, batch, gpu, order=orders[n, k], limit=invariant_limit,
                                                     timed=[]))
    return found


def check(tactic) -> tuple:
    """Worker: compile one tactic; ``(tactic, registers, HGMMA, UTMALDG, spills, seconds, error)``."""
    from decode_projection.projection import compile_projection
    from decode_projection.runtime.sass import kernel_report

    started = time.perf_counter()
    try:
        report = kernel_report(compile_projection(tactic, BF16, "sm_90a", BF16))
    except Exception as error:  # reported per kernel: the others still compile
        return tactic, 0, 0, 0, 0, time.perf_counter() - started, repr(error)
    return tactic, report.registers, report.hgmma, report.utmaldg, report.spills, time.perf_counter() - started, ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=shape, action="append", required=True, help="NxK (repeatable)")
    parser.add_argument("--batches", type=batch_list, default=list(DECODE_BATCHES))
    parser.add_argument("--candidates", type=positive_int, default=16, help="the tune's --candidates")
    parser.add_argument("--invariant-candidates", type=positive_int, default=6)
    parser.add_argument("--workers", type=positive_int, default=1, help="compiling processes")
    parser.add_argument("--gpu", choices=sorted(KNOWN_GPUS), default=H200.name, help="the card the re-tune runs on")
    args = parser.parse_args()
    tactics = sorted(retune_tactics(args.shape, args.batches, limit=args.candidates,
                                    invariant_limit=args.invariant_candidates, gpu=KNOWN_GPUS[args.gpu]), key=str)
    print(f"{len(tactics)} kernels; tactic, registers, HGMMA, UTMALDG, spills, compile s")
    failed = 0
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for tactic, registers, hgmma, utmaldg, spills, seconds, error in pool.map(check, tactics):
            ok = not error and hgmma > 0 and utmaldg > 0 and spills == 0
            failed += not ok
            print(f"{tactic.label:>28} {registers:>4} {hgmma:>5} {utmaldg:>7} {spills:>6} {seconds:6.1f}"
                  f"{'' if ok else '  FAILED ' + error}", flush=True)
    print(f"{len(tactics) - failed} of {len(tactics)} kernels compile with wgmma, TMA loads and no spills")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
