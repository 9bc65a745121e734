"""Compare two sets of saved benchmark runs (``bench --json``) of the same cells: tables before and after a re-tune,
or a kernel before and after a change, timed alternately on one machine.

Per launch context and batch range (M = 1..64, 96..256) it prints the geometric-mean speedup over torch.matmul of
each set over the cells both hold (per cell the medians over that set's runs of ours and of torch.matmul, timed in
the same runs), the cells only one set holds, then every cell whose tactic differs between the sets with its
median times, torch.matmul's in each set. Runs of different GPUs are refused.

    python scripts/compare_runs.py --before old-1.json old-2.json --after new-1.json new-2.json [--policy tuned]
"""

import argparse

from decode_projection.kernel.tactic import stored_tactic
from decode_projection.measure.report import document_cells, median_cells, read_document
from decode_projection.measure.timing import CONTEXTS, geometric_mean

BATCH_RANGES = ((1, 64), (96, 256))


def cells_by_key(paths, policy):
    """``({(n, k, batch, context): cell of medians over the runs}, gpu)`` of one set of runs of ``policy``."""
    runs, gpus = [], set()
    for path in paths:
        document = read_document(path)
        gpus.add((document.get("meta") or {}).get("gpu"))
        runs.append([cell for cell in document_cells(document) if cell["policy"] == policy])
    if len(gpus) != 1:
        raise ValueError(f"runs of more than one GPU: {sorted(map(str, gpus))}")
    return {(c["n"], c["k"], c["batch"], c["context"]): c for c in median_cells(runs)}, gpus.pop()


def speedup(cell):
    """torch.matmul's time over ours."""
    return cell["cublas_us"] / cell["us"]


def summary(before, after):
    """Lines of geometric means per context and batch range over the cells both sets hold."""
    lines = []
    common = before.keys() & after.keys()
    for context in CONTEXTS:
        for low, high in BATCH_RANGES:
            keys = [key for key in common if key[3] == context and low <= key[2] <= high]
            if keys:
                lines.append(f"{context:8s} M={low}-{high}: {geometric_mean(speedup(before[k]) for k in keys):.4f}x -> "
                             f"{geometric_mean(speedup(after[k]) for k in keys):.4f}x over {len(keys)} cells")
    return lines


def changed_cells(before, after):
    """Lines for the cells whose tactic differs: median us before -> after (difference), torch.matmul's, tactics."""
    lines = []
    order = {context: i for i, context in enumerate(CONTEXTS)}
    for key in sorted(before.keys() & after.keys(), key=lambda key: (*key[:3], order.get(key[3], len(order)))):
        old, new = stored_tactic(before[key]["tactic"]), stored_tactic(after[key]["tactic"])
        if old == new:
            continue
        n, k, batch, context = key
        was, now = before[key]["us"], after[key]["us"]
        lines.append(f"{n}x{k} M={batch:<3d} {context:8s} {was:7.2f} -> {now:7.2f} ({now - was:+.2f})  "
                     f"torch.matmul {before[key]['cublas_us']:7.2f} / {after[key]['cublas_us']:7.2f}  "
                     f"{old.label} -> {new.label}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", required=True, help="runs of the first set (bench --json)")
    parser.add_argument("--after", nargs="+", required=True, help="runs of the second set, same cells")
    parser.add_argument("--policy", default="tuned", help="the policy compared (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        before, gpu = cells_by_key(args.before, args.policy)
        after, other = cells_by_key(args.after, args.policy)
    except (OSError, KeyError, AttributeError, TypeError, ValueError) as error:
        parser.error(f"unreadable runs: {error!r}")
    if gpu != other:
        parser.error(f"the sets ran on different GPUs: {gpu} and {other}")
    if not before or not after:
        parser.error(f"no cells of the policy {args.policy!r} in {'--before' if not before else '--after'}")
    if not before.keys() & after.keys():
        parser.error("the two sets share no cell")
    print(f"# {gpu}: geometric mean over torch.matmul, before -> after ({len(args.before)} and "
          f"{len(args.after)} runs; per cell the medians over runs)")
    print("\n".join(summary(before, after)))
    only = sorted(before.keys() ^ after.keys())
    if only:
        print(f"# {len(only)} cells in one set only, left out: " + ", ".join(
            f"{n}x{k} M={batch} {context}" for n, k, batch, context in only))
    print("# cells whose tactic changed: median us before -> after (difference), torch.matmul's before / after, "
          "tactics")
    print("\n".join(changed_cells(before, after)))


if __name__ == "__main__":
    main()
