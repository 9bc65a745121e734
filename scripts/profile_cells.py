"""Where the last 8% of bandwidth goes: DRAM bytes and kernel time of a few cells under Nsight Compute.

Back to back the projection streams mid and large weights at 90-93% of the
read-only kernel's rate (docs/l2-policies.md). Two explanations predict
different counters: bytes read twice (the weight map's 256-byte L2 promotion
fetches the neighbouring 128 bytes of a row, which EVICT_FIRST may drop before
the next stage asks for it) show as DRAM read bytes above the weight's size;
latency or occupancy limits show as the same bytes over a longer time. Each
cell runs the shipped tactic (its weight map's L2 promotion 128 B; 256 B and none
were profiled with this script as of commit fa6ce36) next to the read-only kernel
over the same weight.

Run under ncu, then summarize (scripts/gpu-check PROFILE=1 does both):

    ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_op_read_hit_rate.pct \\
        python3 scripts/profile_cells.py --labels labels.txt > ncu.csv
    python3 scripts/profile_cells.py --summarize ncu.csv --labels labels.txt
"""

import argparse
import csv
import io

CELLS = ((8448, 7168, 1), (7168, 14336, 1), (20480, 7168, 1), (3584, 7168, 1), (2112, 7168, 1), (7168, 14336, 64))
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "lts__t_sector_op_read_hit_rate.pct")
OURS = "SplitKGemm"  # in our kernels' names; every other profiled kernel is torch.matmul's


def launch_cells(labels_path):
    """Run every cell's kernels once inside the profiler range; write one label per launch, in order."""

    import torch

    from decode_projection.measure.ceiling import stream_read
    from decode_projection.projection import PreparedProjection

    labels, launches, alive = [], [], []
    for n, k, batch in CELLS:
        weight = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
        out = torch.empty(batch, n, device="cuda", dtype=torch.bfloat16)
        projection = PreparedProjection.for_weight(weight, batches=(batch,))
        tactic = projection.policies[batch]

        def launch(projection=projection, x=x, out=out):
            projection.run(x, out)

        launch()  # outside the range: loads the module before anything is profiled
        launches.append(launch)
        labels.append(f"{n}x{k} M={batch} {tactic.label}")
        launches.append(lambda weight=weight: stream_read(weight))
        labels.append(f"{n}x{k} read-only kernel")
        alive += [weight, x, out, projection]
    launches[-1]()  # the read-only kernel's module, too
    profile(launches, labels, labels_path)


def launch_tactics(cells, labels_path):
    """Run every tactic of every ``{(n, k, batch): tactics}`` cell, then torch.matmul on the same inputs,
    once each inside the profiler range; label our launches (torch.matmul's are told apart by kernel name)."""
    import torch

    from decode_projection.kernel.tactic import as_tactic
    from decode_projection.projection import PreparedProjection

    labels, launches, alive = [], [], []
    for (n, k, batch), tactics in cells.items():
        weight = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
        out = torch.empty(batch, n, device="cuda", dtype=torch.bfloat16)
        for tactic in map(as_tactic, tactics):
            projection = PreparedProjection(weight, {batch: tactic}).prepare()
            projection.run(x, out)  # outside the range: loads the module before anything is profiled
            launches.append(lambda projection=projection, x=x, out=out: projection.run(x, out))
            labels.append(f"{n}x{k} M={batch} {tactic.label}")
            alive.append(projection)
        launches.append(lambda weight=weight, x=x: torch.matmul(x, weight.t()))
        torch.matmul(x, weight.t())
        alive += [weight, x, out]
    profile(launches, labels, labels_path)


def profile(launches, labels, labels_path):
    """Run each launch once inside the profiler range, then write the labels, one per line."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    with open(labels_path, "w") as f:
        f.write("\n".join(labels) + "\n")


def ncu_rows(csv_path):
    """The profiled launches of an ``ncu --csv --page raw`` output, as dicts by column (units row dropped)."""
    with open(csv_path) as f:
        text = f.read()
    rows = csv.DictReader(io.StringIO(text[text.index('"ID"'):]))
    return [row for row in rows if row.get("ID", "").isdigit()]


def summarize(csv_path, labels_path):
    """One line per launch: time, DRAM bytes read over the weight's, effective TB/s, L2 read hit rate."""
    with open(labels_path) as f:
        labels = f.read().splitlines()
    rows = ncu_rows(csv_path)
    if len(rows) != len(labels):
        raise SystemExit(f"{len(rows)} profiled launches, {len(labels)} labels")
    print(f"{'launch':<58} {'us':>7} {'DRAM read / weight':>18} {'TB/s':>6} {'L2 hit %':>8}")
    for label, row in zip(labels, rows):
        n, k = (int(v) for v in label.split()[0].split("x"))
        seconds = number(row["gpu__time_duration.sum"]) * 1e-9  # --print-units base: nanoseconds, bytes
        dram = number(row["dram__bytes_read.sum"])
        print(f"{label:<58} {seconds * 1e6:7.2f} {dram / (n * k * 2):18.3f} {n * k * 2 / seconds / 1e12:6.2f} "
              f"{number(row['lts__t_sector_op_read_hit_rate.pct']):8.1f}")


def number(text):
    """A value of ncu's CSV (which may group digits with commas)."""
    return float(text.replace(",", ""))


def command_line(doc, launch, summarize_csv, metrics=None):
    """The profile scripts' command line: launch under ncu (writing labels), summarize its CSV, or print
    the ``metrics`` ncu should collect."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--labels", required=True, help="file of our launches' labels, written when profiling")
    parser.add_argument("--summarize", help="ncu --csv --page raw output to summarize instead of profiling")
    if metrics is not None:
        parser.add_argument("--metrics", action="store_true", help="print the metrics ncu should collect, and exit")
    args = parser.parse_args()
    if metrics is not None and args.metrics:
        print(",".join(metrics))
    elif args.summarize:
        summarize_csv(args.summarize, args.labels)
    else:
        launch(args.labels)


def main():
    command_line(__doc__, launch_cells, summarize)


if __name__ == "__main__":
    main()
