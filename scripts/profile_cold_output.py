"""Cold output lines: is their cost inside the kernel or between kernels? Kernel time under Nsight Compute.

After a glue kernel, writing an output whose lines are missing from L2 costs
our projection about 0.9 us more than writing one output buffer kept in L2 (on
1536 x 128 at M=64; 0.15 back to back, and cuBLAS 0.2 in both contexts;
docs/performance.md, v20). Prefetching the output tile into L2 did not remove
it. Under ncu every kernel runs alone, so each kernel's own duration with a
cold output, against the same launch with a hot one, says whether that time is
spent inside the kernel (its epilogue's stores, its end) or around it. Each
launch follows a glue kernel, as in the benchmark's after-glue context.

    ncu --clock-control none --cache-control none --profile-from-start off --csv --page raw --print-units base \\
        --metrics <METRICS, comma-separated> python3 scripts/profile_cold_output.py --labels labels.txt > ncu.csv
    python3 scripts/profile_cold_output.py --summarize ncu.csv --labels labels.txt
"""

import statistics
from collections import defaultdict

from profile_cells import command_line, ncu_rows, number, profile

CELLS = ((1536, 128, 16), (1536, 128, 64), (3072, 128, 64))
REPEATS = 7
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")  # one ncu pass
GLUE = "elementwise"  # in the glue kernel's name (torch's add_); every other kernel is ours or torch.matmul's


def launch_cells(labels_path):
    """Per cell and repeat: glue, then ours and torch.matmul into a cold output copy and into one hot output,
    each launch reading a weight copy no launch has read before."""
    import torch

    from decode_projection.projection import PreparedProjection
    from decode_projection.timing import cold_copies, foreign_kernel

    glue = foreign_kernel("cuda")
    labels, launches, alive = [], [], []
    for n, k, batch in CELLS:
        copies = cold_copies(n * k * 2)
        weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
        outs = [torch.zeros(batch, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        tactic = PreparedProjection.for_weight(weights[0], batches=(batch,)).policies[batch]
        projections = [PreparedProjection(w, {batch: tactic}).prepare() for w in weights]
        projections[0].run(x, outs[0])  # outside the range: loads the module
        torch.matmul(x, weights[0].T, out=outs[0])
        fresh = iter(range(1, copies))  # weight and output copies nothing has touched since they were made
        for _ in range(REPEATS):
            for temperature in ("cold", "hot"):
                for provider in (f"ours {tactic.label}", "torch.matmul"):
                    i = next(fresh)  # every launch reads a cold weight
                    out = outs[i] if temperature == "cold" else outs[0]
                    launches += [glue, launcher(provider, x, weights[i], projections[i], out)]
                    labels.append(f"{n}x{k} M={batch} {provider} {temperature}")
        alive += [weights, x, outs, projections]
    profile(launches, labels, labels_path)


def launcher(provider, x, weight, projection, out):
    """``launch()`` for one provider's call on one weight copy into ``out``."""
    import torch

    if provider == "torch.matmul":
        return lambda: torch.matmul(x, weight.T, out=out)
    return lambda: projection.run(x, out)


def summarize(csv_path, labels_path):
    """Median kernel time and DRAM bytes per cell, provider and output temperature."""
    with open(labels_path) as f:
        labels = f.read().splitlines()
    rows = [row for row in ncu_rows(csv_path) if GLUE not in row["Kernel Name"]]
    if len(rows) != len(labels):
        raise SystemExit(f"{len(rows)} profiled kernels besides the glue, {len(labels)} labels: "
                         "torch.matmul ran more than one kernel per call")
    values = defaultdict(list)
    for label, row in zip(labels, rows):
        values[label].append([number(row[metric]) for metric in METRICS])
    print(f"{'launch (median of repeats)':<52} {'us':>6} {'DRAM read KB':>12} {'DRAM write KB':>13}")
    for label, samples in values.items():
        time, read, write = (statistics.median(column) for column in zip(*samples))
        print(f"{label:<52} {time / 1e3:6.2f} {read / 1e3:12.1f} {write / 1e3:13.1f}")


def main():
    command_line(__doc__, launch_cells, summarize, METRICS)


if __name__ == "__main__":
    main()
