"""How far the heuristic's picks run behind the best tactic a tune timed, per timings file (``tune --timings``).

For each cell (shape, batch) of a file, the heuristic's tactic on the card the file was timed on (``--gpu``) is
looked up among the timed ones and its time (the geometric mean over the launch contexts timed, as the tuner ranks)
divided by the best (``--worst-context``: its time over the tuner's choice in each context, the worst); printed is
the geometric mean of that ratio at streaming (M <= 64) and compute-bound batches, how many cells run more than
FAR_BEHIND behind, and how many timed no such tactic. ``--newest`` judges the files as one, each cell from the last
file (in the order given) that timed it. The heuristic is what every shape or batch without a tuned table gets, on
any GPU.

    python scripts/heuristic_regret.py docs/measurements/*tune-timings*.json.gz [--cells] [--gpu "NVIDIA H100 80GB HBM3"]
    python scripts/heuristic_regret.py --newest --gpu "NVIDIA H100 80GB HBM3" docs/measurements/*timings-h100*.json.gz
"""

import argparse
import math

from decode_projection.kernel.tactic import stored_tactic
from decode_projection.measure.report import read_document
from decode_projection.measure.timing import geometric_mean
from decode_projection.policy.policies import default_tactic
from decode_projection.policy.workload import LAST_STREAMING_BATCH
from decode_projection.runtime.gpu import H200, KNOWN_GPUS
from decode_projection.tuning.tune import row_times

FAR_BEHIND = 1.10  # issue 44's bar: the heuristic within 10% of the tuned table in every cell


def regrets(cells, spec=H200, *, worst_context=False):
    """``[(n, k, batch, pick / best or None, pick)]`` for the cells of one timings file timed on ``spec``'s card:
    the geometric means over the contexts compared, or with ``worst_context`` the pick's time over the tuner's
    choice (the best geometric mean) in each context, the worst of those."""
    found = []
    for cell in cells:
        n, k, batch = cell["n"], cell["k"], cell["batch"]
        # Tactics of older kernels may no longer be valid, and only the heuristic's own pick is looked up.
        times = {stored_tactic(fields): us for fields, us in row_times(cell)}
        means = {tactic: geometric_mean(us.values()) for tactic, us in times.items()}
        pick = default_tactic(n, k, batch, spec)
        if pick not in means:
            ratio = None
        elif worst_context:
            chosen = times[min(means, key=means.get)]
            ratio = max(us / chosen[context] for context, us in times[pick].items())
        else:
            ratio = means[pick] / min(means.values())
        found.append((n, k, batch, ratio, pick))
    return found


def newest_cells(documents):
    """The cells of ``documents`` (timings files' cells, oldest first), each (n, k, batch) from the last that has it."""
    newest = {}
    for cells in documents:
        newest.update({(cell["n"], cell["k"], cell["batch"]): cell for cell in cells})
    return list(newest.values())


def geomean(values):
    """The geometric mean of ``values`` (nan for none)."""
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timings", nargs="+", help="tune --timings files (.json or .json.gz)")
    parser.add_argument("--cells", action="store_true", help="also print every cell's ratio and pick")
    parser.add_argument("--gpu", choices=sorted(KNOWN_GPUS), default=H200.name, help="the card the files were timed on")
    parser.add_argument("--newest", action="store_true",
                        help="judge the files as one, each cell from the last file given that timed it")
    parser.add_argument("--worst-context", action="store_true",
                        help="judge each pick in its worst launch context against the tuner's choice (issue 44's "
                             "bar holds in every context), not on the geometric mean")
    args = parser.parse_args()
    documents = [(path, read_document(path)) for path in args.timings]
    if args.newest:
        documents = [(f"newest of {len(documents)} files", newest_cells(cells for _, cells in documents))]
    for path, cells in documents:
        found = regrets(cells, KNOWN_GPUS[args.gpu], worst_context=args.worst_context)
        streaming = [r for _, _, b, r, _ in found if r is not None and b <= LAST_STREAMING_BATCH]
        compute = [r for _, _, b, r, _ in found if r is not None and b > LAST_STREAMING_BATCH]
        untimed = sum(r is None for *_, r, _ in found)
        behind = sum(r is not None and r > FAR_BEHIND for *_, r, _ in found)
        print(f"{path}: pick / best {geomean(streaming):.3f} over {len(streaming)} streaming cells, "
              f"{geomean(compute):.3f} over {len(compute)} compute-bound; more than {FAR_BEHIND:.2f}x behind in "
              f"{behind}; pick not timed in {untimed}")
        for n, k, batch, ratio, pick in found if args.cells else ():
            print(f"  {n}x{k} M={batch}: {'-' if ratio is None else f'{ratio:.4f}'}  {pick}")


if __name__ == "__main__":
    main()
