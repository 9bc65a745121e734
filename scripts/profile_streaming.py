"""Why batches of 48-64 run 5-14% above the weight's read time: a full Nsight Compute profile of a few cells.

At M=1 the shipped tactics stream within 2% of the read-only kernel; at M=64
the large weights run 10-14% above it (6288 x 7168: 24.5 against 21.7 us;
20480 x 7168: 75.0 against 65.9), and 7168 x 1536 M=48 ran slower than
torch.matmul. A batch of 64 does 64 FLOP per weight byte, so where few CTAs
stream a weight (49 on 6288 x 7168 with 128-row tiles) the tensor pipe and
the shared memory that feeds it (each weight byte is written by TMA and read
by wgmma, each activation byte read once per 64 weight rows) carry several
times the bytes HBM does. These counters say which unit each tactic
saturates, next to M=1 and torch.matmul on the same weight. Run under ncu
(``--set full``), then summarize (or both through scripts/gpu-check with
PROFILE_STREAMING=1):

    ncu --set full --clock-control none --profile-from-start off --csv --page raw --print-units base \\
        python3 scripts/profile_streaming.py --labels labels.txt > ncu.csv
    python3 scripts/profile_streaming.py --summarize ncu.csv --labels labels.txt
"""

from profile_cells import OURS, command_line, launch_tactics, ncu_rows, number

# The H200 table's tactics of 2026-12-03 at M = 48 and 64 next to M=1, and the same tiles with their activations multicast to two
# weight tiles (which halves the activation reads from L2 and did not run faster: docs/streaming.md).
CELLS = {
    (7168, 14336, 1): ("56,8,1,6,4,E",),
    (7168, 14336, 64): ("56,64,1,7,2", "56,64,1,7,2,2"),
    (7168, 3584, 48): ("64,48,1,8,2,E",),
    (7168, 3584, 64): ("56,64,1,7,2", "56,64,1,7,2,2"),
    (3584, 7168, 64): ("32,64,1,7,2,E",),
}
COLUMNS = {  # heading: ncu metric (percentages of peak over the kernel's elapsed time)
    "us": "gpu__time_duration.sum",
    "MHz": "gpc__cycles_elapsed.avg.per_second",
    "tensor": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "smem rd": "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed",
    "smem wr": "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed",
    "L2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "HBM": "dram__bytes_read.sum.pct_of_peak_sustained_elapsed",
}
# SM busy: the average SM's active cycles over the elapsed cycles (how much of the GPU the grid kept busy).
ACTIVE, ELAPSED = "sm__cycles_active.avg", "gpc__cycles_elapsed.max"
STALLS = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")


def launch_cells(labels_path):
    """Run every tactic of every cell, then torch.matmul, once inside the profiler range; label our launches."""
    from time_tactics import parse_tactic

    launch_tactics({cell: [parse_tactic(t) for t in tactics] for cell, tactics in CELLS.items()}, labels_path)


def summarize(csv_path, labels_path):
    """One line per profiled kernel: time, clock, unit throughputs (% of peak) and its top three stall reasons."""
    with open(labels_path) as f:
        labels = iter(f.read().splitlines())
    rows = ncu_rows(csv_path)
    headings = [*COLUMNS, "SM busy"]
    print(f"{'kernel':<40}" + "".join(f"{heading:>8}" for heading in headings) + "  top stalls (warps per issue)")
    for row in rows:
        name = row["Kernel Name"]
        label = next(labels) if OURS in name else f"  torch.matmul: {name[:24]}"
        values = [number(row[metric]) if row.get(metric) else float("nan") for metric in COLUMNS.values()]
        values[0] /= 1e3
        values[1] /= 1e6
        values.append(100 * number(row[ACTIVE]) / number(row[ELAPSED]))
        stalls = sorted(((number(v), key[len(STALLS[0]):-len(STALLS[1])]) for key, v in row.items()
                         if key.startswith(STALLS[0]) and key.endswith(STALLS[1]) and v), reverse=True)
        print(f"{label:<40}" + "".join(f"{v:8.1f}" for v in values) + "  "
              + ", ".join(f"{reason} {value:.2f}" for value, reason in stalls[:3]))


def main():
    command_line(__doc__, launch_cells, summarize)


if __name__ == "__main__":
    main()
