"""What bounds the compute-bound batches (M=256): tensor pipe, L2 or HBM, under Nsight Compute.

On N = 7168 weights every grid of whole weight tiles fills at most 112-114 of
the 132 SMs, yet 8448 x 7168, whose 132 tiles of 64 rows fill every SM, also
trails cuBLAS at M=256. Candidates: a 64 x 256 tile re-reads every activation
from L2 once per weight tile, multicast shares those reads but measured slower,
wider weight tiles need a split-K reduction. These counters say which resource
each tactic saturates, next to cuBLAS on the same inputs (on the H200: none;
the tensor pipe is 64-70% busy against cuBLAS's 83-87%, docs/compute-bound-tiling.md). Run under ncu, then summarize (or both through
scripts/gpu-check with PROFILE_COMPUTE=1):

    ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \\
        --metrics <METRICS, comma-separated> python3 scripts/profile_compute_bound.py --labels labels.txt > ncu.csv
    python3 scripts/profile_compute_bound.py --summarize ncu.csv --labels labels.txt
"""

from profile_cells import OURS, command_line, launch_tactics, ncu_rows, number

CELLS = {
    (8448, 7168, 256): ((64, 256, 1, 5, 1, 1), (64, 256, 1, 5, 1, 2), (128, 256, 2, 4, 1, 1), (128, 128, 1, 7, 1, 1)),
    (7168, 14336, 256): ((64, 256, 1, 5, 1, 1), (64, 256, 1, 5, 1, 4), (128, 256, 2, 4, 1, 1), (128, 128, 1, 7, 1, 1)),
}
METRICS = (
    "gpu__time_duration.sum",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_bytes.sum",
    "gpc__cycles_elapsed.avg.per_second",
)


def launch_cells(labels_path):
    """Run every tactic of every cell and then torch.matmul once inside the profiler range; label our launches."""
    launch_tactics(CELLS, labels_path)


def summarize(csv_path, labels_path):
    """One line per profiled kernel: time, SM clock, tensor pipe, L2 and HBM throughput (% of peak), L2 bytes."""
    with open(labels_path) as f:
        labels = iter(f.read().splitlines())
    rows = ncu_rows(csv_path)
    print(f"{'kernel':<52} {'us':>7} {'MHz':>5} {'tensor %':>8} {'L2 %':>5} {'HBM %':>6} {'L2 GB':>6}")
    for row in rows:
        name = row["Kernel Name"]
        label = next(labels) if OURS in name else f"  torch.matmul: {name[:36]}"
        print(f"{label:<52} {number(row[METRICS[0]]) / 1e3:7.2f} {number(row[METRICS[5]]) / 1e6:5.0f} "
              f"{number(row[METRICS[1]]):8.1f} {number(row[METRICS[2]]):5.1f} {number(row[METRICS[3]]):6.1f} "
              f"{number(row[METRICS[4]]) / 1e9:6.2f}")


def main():
    command_line(__doc__, launch_cells, summarize, METRICS)


if __name__ == "__main__":
    main()
