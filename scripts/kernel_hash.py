"""One hash of the sources compute-sanitizer vouches for, and the record of the last clean run on them.

scripts/gpu-check runs the sanitizer whenever this hash differs from the one in
docs/measurements/sanitizer-clean.txt, and writes a new record into $OUT when every tool found nothing on every
case (the lead copies it into the tree). SOURCES are the kernels' code (the projection, the PDL copy, the norms
and SiLU-and-mul), what fixes their compiled signatures and launches (tactic rules, fake tensors, views, TMA
maps) and the cases themselves: new cases have not run clean yet.

    python scripts/kernel_hash.py                       # print the hash of this tree's SOURCES
    python scripts/kernel_hash.py --check RECORD        # exit 0 if RECORD holds that hash, else 1
    python scripts/kernel_hash.py --record RECORD --card CARD --tools "memcheck ..." [--summary LINE ...]

``--root DIR`` hashes another tree.
"""

import argparse
import datetime
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "decode_projection/kernel/splitk.py",
    "decode_projection/kernel/launch.py",
    "decode_projection/kernel/tactic.py",
    "decode_projection/runtime/sm90.py",
    "decode_projection/projection.py",
    "decode_projection/runtime/__init__.py",
    "decode_projection/runtime/call_slots.py",
    "decode_projection/measure/glue.py",
    "decode_projection/kernel/norm.py",
    "decode_projection/kernel/activation.py",
    "decode_projection/kernel/rowwise.py",
    "scripts/sanitize_cases.py",
)
RECORD = "docs/measurements/sanitizer-clean.txt"
HEADER = """\
# The kernel sources compute-sanitizer last ran clean on: every tool below on every case of
# scripts/sanitize_cases.py, zero findings. Written by scripts/gpu-check into $OUT, copied here by hand;
# scripts/kernel_hash.py --check compares its hash with the tree's sources, and scripts/gpu-check runs the
# sanitizer again whenever they differ.
"""


def kernel_hash(root=ROOT, sources=SOURCES) -> str:
    """SHA-256 over each source's path and the SHA-256 of its bytes: any edit, rename or move between files counts."""
    digest = hashlib.sha256()
    for source in sources:
        content = (Path(root) / source).read_bytes()  # a missing source raises: never a hash of less
        digest.update(f"{source}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return digest.hexdigest()


def read_record(path) -> dict:
    """The ``key: value`` lines of a record (comments skipped); empty if there is no record."""
    path = Path(path)
    if not path.is_file():
        return {}
    fields = {}
    for line in path.read_text().splitlines():
        key, colon, value = line.partition(":")
        if colon and not line.startswith("#"):
            fields.setdefault(key.strip(), value.strip())
    return fields


def recorded_hash(path) -> str | None:
    """The hash a record holds (``none`` where no clean run was recorded), or None without a record."""
    return read_record(path).get("hash")


def write_record(path, digest, card, tools, summaries=(), sources=SOURCES):
    """Record a clean run: the hash, today's date (UTC), the card, the tools and their summary lines."""
    lines = [f"hash: {digest}", f"date: {datetime.datetime.now(datetime.timezone.utc).date()}", f"card: {card}",
             f"tools: {tools}", f"sources: {' '.join(sources)}", *summaries]
    Path(path).write_text(HEADER + "\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to hash (default: this one)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", metavar="RECORD", help="exit 0 if RECORD holds this tree's hash, else 1")
    action.add_argument("--record", metavar="RECORD", help="write a record of a clean run on this tree")
    parser.add_argument("--card", default="unknown", help="with --record: the GPU it ran on")
    parser.add_argument("--tools", default="", help="with --record: the sanitizer tools that ran")
    parser.add_argument("--summary", action="append", default=[], help="with --record: a tool's summary line")
    args = parser.parse_args(argv)
    digest = kernel_hash(args.root)
    if args.record:
        write_record(args.record, digest, args.card, args.tools, args.summary)
        print(f"recorded a clean sanitizer run on {digest} in {args.record}")
        return 0
    if args.check:
        record = read_record(args.check)
        if record.get("hash") == digest:
            print(f"kernel sources unchanged since the clean sanitizer run of {record.get('date', '?')} "
                  f"on {record.get('card', '?')}")
            return 0
        if not record or record.get("hash") in (None, "none"):
            print(f"no clean sanitizer run recorded in {args.check}")
        else:
            print(f"kernel sources changed since the clean sanitizer run of {record.get('date', '?')} "
                  f"(recorded {record['hash'][:12]}, now {digest[:12]})")
        return 1
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
