"""Where our kernels' warps wait: the SASS instructions with the most warp-stall samples, per profiled launch.

In a pipelined kernel the consumers' wait on a stage's full barrier (a
``SYNCS.PHASECHK`` try-wait and the branch back to it) collects the samples
when data arrives too slowly; samples on HGMMA and the wgmma waits mean the
consumers are busy; the producer's wait on a free stage means the consumers
release stages too slowly. Profile the launches of scripts/profile_streaming.py
(or any script that writes one label per launch of ours) with Nsight Compute's
source counters, then summarize:

    ncu --section SourceCounters --clock-control none --profile-from-start off \\
        -k regex:SplitKGemm --page source --csv --print-source sass \\
        python3 scripts/profile_streaming.py --labels labels.txt > source.csv
    python3 scripts/stall_sites.py source.csv labels.txt
"""

import argparse
import csv
import gzip
import io

SAMPLES = "Warp Stall Sampling (All Samples)"


def launches(csv_path):
    """One list of instruction rows per profiled launch of an ``ncu --page source --csv`` output."""
    with (gzip.open(csv_path, "rt") if csv_path.endswith(".gz") else open(csv_path)) as f:
        blocks = []
        for line in f.read().splitlines():
            if line.startswith('"Kernel Name"'):
                blocks.append([])
            elif blocks:
                blocks[-1].append(line)
    return [list(csv.DictReader(io.StringIO("\n".join(block)))) for block in blocks]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output (.gz too)")
    parser.add_argument("labels", help="one label per profiled launch, in order")
    parser.add_argument("--top", type=int, default=8, help="instructions shown per launch (default: %(default)s)")
    args = parser.parse_args()
    with open(args.labels) as f:
        labels = f.read().splitlines()
    profiled = launches(args.csv)
    if len(profiled) != len(labels):
        raise SystemExit(f"{len(profiled)} profiled launches, {len(labels)} labels")
    for label, rows in zip(labels, profiled):
        total = sum(int(row[SAMPLES]) for row in rows)
        print(f"{label}: {total} stall samples over {len(rows)} instructions")
        print(f"{'share':>6} {'index':>5}  {'instruction':<56} {'executed':>9}  top reasons (samples)")
        for index, row in sorted(enumerate(rows), key=lambda found: -int(found[1][SAMPLES]))[:args.top]:
            reasons = sorted(((int(value), key[len("stall_"):]) for key, value in row.items()
                              if key.startswith("stall_") and "Not Issued" not in key and value.isdigit()),
                             reverse=True)
            named = ", ".join(f"{reason} {count}" for count, reason in reasons[:2] if count)
            print(f"{100 * int(row[SAMPLES]) / max(total, 1):5.1f}% {index:5d}  {row['Source'].strip()[:56]:<56} "
                  f"{row['Instructions Executed']:>9}  {named}")
        print()


if __name__ == "__main__":
    main()
