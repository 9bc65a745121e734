"""Pin the SASS of every shipped tactic: record a hash per kernel, or check a tree against the record.

Every distinct tactic of the shipped tables (decode_projection/policy/tables/*.json) is compiled for sm_90a with the
weight and output dtypes of its table entries and programmatic dependent launch (what ``PreparedProjection`` launches
by default), straight through ``cute.compile`` (``projection.compile_kernel``): the disk cache is bypassed, so a
change it does not fingerprint cannot hide behind a cached kernel. The nvdisasm listing is normalised (the kernel's
symbol, whose name the DSL derives from the MMA atom and may embed an address, becomes ``KERNEL``) and hashed. A
refactor that means to leave the code alone checks that every hash stays the same:

    python scripts/sass_identity.py --record tests/data/sass-baseline.json
    python scripts/sass_identity.py --check tests/data/sass-baseline.json --workers 2
"""

import argparse
import hashlib
import json
import multiprocessing
import re
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# The package of this script's tree, ahead of the one the environment installed: an editable install points at
# another checkout, and a check of that one's kernels would say nothing about this tree's.
TREE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TREE))

import torch  # noqa: E402

import decode_projection  # noqa: E402
from decode_projection.policy.tables import shipped_tables  # noqa: E402

ARCH = "sm_90a"
ADDRESS = re.compile(r"0x[0-9a-f]{9,}")  # host addresses an object's repr may leave in a symbol


def shipped_jobs() -> dict:
    """``{label: (tactic, weight dtype name, output dtype name)}`` for every distinct kernel the shipped tables use."""
    jobs = {}
    for key, batches in shipped_tables().items():
        for tactic in batches.values():
            label = f"{tactic.label} {key.weight_dtype}->{key.output_dtype}"
            jobs[label] = (tactic, key.weight_dtype, key.output_dtype)
    return dict(sorted(jobs.items()))


def normalised_sass(sass: str, kernel: str) -> str:
    """The listing with the kernel's symbol, and any address left in another symbol, replaced by fixed names."""
    return ADDRESS.sub("0xADDRESS", sass.replace(kernel, "KERNEL"))


def sass_hash(job) -> tuple[str, str]:
    """Worker: ``(label, sha256 of the normalised SASS)`` of one job, compiled in a fresh dump directory."""
    from decode_projection.projection import compile_kernel
    from decode_projection.runtime.sass import keep_cubin_options, kernel_report

    label, (tactic, weight_dtype, output_dtype) = job
    with tempfile.TemporaryDirectory() as dump:
        compiled = compile_kernel(tactic, getattr(torch, output_dtype), getattr(torch, weight_dtype),
                                  options=keep_cubin_options(dump, ARCH))
        report = kernel_report(compiled)
    return label, hashlib.sha256(normalised_sass(report.sass, report.kernel).encode()).hexdigest()


def differences(recorded: dict, found: dict) -> list[str]:
    """One line per label whose hash differs, or that only one side has."""
    lines = []
    for label in sorted(recorded.keys() | found.keys()):
        if label not in found:
            lines.append(f"{label}: recorded, no longer shipped")
        elif label not in recorded:
            lines.append(f"{label}: shipped, not recorded")
        elif recorded[label] != found[label]:
            lines.append(f"{label}: SASS differs")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, metavar="FILE", help="write {tactic label: SASS sha256} to FILE")
    mode.add_argument("--check", type=Path, metavar="FILE", help="compare with FILE; exit 1 on any difference")
    parser.add_argument("--workers", type=int, default=1, help="compiling processes (default: %(default)s)")
    parser.add_argument("--match", type=re.compile, metavar="REGEX",
                        help="only the kernels whose label this matches (a quick look; --check compares only those)")
    args = parser.parse_args(argv)
    jobs = [(label, job) for label, job in shipped_jobs().items() if args.match is None or args.match.search(label)]
    package = Path(decode_projection.__file__).parent
    if package != TREE / "decode_projection":
        parser.error(f"imported {package}, not this tree's package")
    print(f"compiling {len(jobs)} shipped kernels of {package} for {ARCH} in {args.workers} process(es)", flush=True)
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            found = dict(pool.map(sass_hash, jobs))
    else:
        found = dict(map(sass_hash, jobs))
    if args.record:
        if args.match is not None:
            parser.error("--record writes every kernel: no --match")
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(found)} hashes in {args.record}")
        return 0
    recorded = json.loads(args.check.read_text())
    if args.match is not None:
        recorded = {label: digest for label, digest in recorded.items() if args.match.search(label)}
    lines = differences(recorded, found)
    for line in lines:
        print(line)
    print(f"{len(found) - len(lines)} of {len(found)} kernels' SASS identical to {args.check}"
          if lines else f"all {len(found)} kernels' SASS identical to {args.check}")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
