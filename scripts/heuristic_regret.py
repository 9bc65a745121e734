"""How far the heuristic's picks run behind the best tactic a tune timed, per timings file (``tune --timings``).

For each cell (shape, batch) of a file, the heuristic's tactic on the card the file was timed on (``--gpu``) is
looked up among the timed ones and its time (the geometric mean over the launch contexts timed, as the tuner ranks)
divided by the best; printed is the geometric mean of that ratio at streaming (M <= 64) and compute-bound batches,
and how many cells timed no such tactic. The heuristic is what every shape or batch without a tuned table gets, on
any GPU.

    python scripts/heuristic_regret.py docs/measurements/*tune-timings*.json.gz [--cells] [--gpu "NVIDIA H100 80GB HBM3"]
"""

import argparse
import math

from decode_projection.kernel.tactic import stored_tactic
from decode_projection.measure.report import read_document
from decode_projection.measure.timing import geometric_mean
from decode_projection.policy.policies import default_tactic
from decode_projection.runtime.gpu import H200, KNOWN_GPUS
from decode_projection.tuning.tune import row_times

LAST_STREAMING_BATCH = 64


def regrets(cells, spec=H200):
    """``[(n, k, batch, pick / best or None, pick)]`` for the cells of one timings file timed on ``spec``'s card."""
    found = []
    for cell in cells:
        n, k, batch = cell["n"], cell["k"], cell["batch"]
        # Tactics of older kernels may no longer be valid, and only the heuristic's own pick is looked up.
        means = {stored_tactic(fields): geometric_mean(us.values()) for fields, us in row_times(cell)}
        pick = default_tactic(n, k, batch, spec)
        found.append((n, k, batch, means[pick] / min(means.values()) if pick in means else None, pick))
    return found


def geomean(values):
    """The geometric mean of ``values`` (nan for none)."""
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timings", nargs="+", help="tune --timings files (.json or .json.gz)")
    parser.add_argument("--cells", action="store_true", help="also print every cell's ratio and pick")
    parser.add_argument("--gpu", choices=sorted(KNOWN_GPUS), default=H200.name, help="the card the files were timed on")
    args = parser.parse_args()
    for path in args.timings:
        found = regrets(read_document(path), KNOWN_GPUS[args.gpu])
        streaming = [r for _, _, b, r, _ in found if r is not None and b <= LAST_STREAMING_BATCH]
        compute = [r for _, _, b, r, _ in found if r is not None and b > LAST_STREAMING_BATCH]
        untimed = sum(r is None for *_, r, _ in found)
        print(f"{path}: pick / best {geomean(streaming):.3f} over {len(streaming)} streaming cells, "
              f"{geomean(compute):.3f} over {len(compute)} compute-bound; pick not timed in {untimed}")
        for n, k, batch, ratio, pick in found if args.cells else ():
            print(f"  {n}x{k} M={batch}: {'-' if ratio is None else f'{ratio:.4f}'}  {pick}")


if __name__ == "__main__":
    main()
