"""Tuned tactic tables as data: JSON per GPU, keyed by shape, dtypes, mode and batch.

A table is only used when it was measured on the same GPU (name and SM count)
for the same shape and dtypes; otherwise the caller falls back to the
heuristic and is told so. Tables of your own (``tune --out``), named in
``DECODE_PROJECTION_TABLES``, replace the shipped ones shape by shape.
Entries are checked with the tactic's validity predicate (``tactic.py``) when
loaded, so a stale table fails loudly instead of launching a tactic the kernel
no longer accepts. A table stores each tactic by field name (format 2); tables
of format 1, which stored the fields as a list in declaration order, still read.
"""

import json
import os
import stat
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from ..kernel.tactic import SplitKTactic, as_tactic, stored_tactic

SHIPPED = Path(__file__).with_name("tables")
FORMAT = 2  # tactics by field name
READABLE_FORMATS = (1, 2)  # 1: tactics as lists of their fields in declaration order
USER_TABLES = "DECODE_PROJECTION_TABLES"  # paths of tables of your own, separated by os.pathsep


@dataclass(frozen=True)
class TableKey:
    """Everything a tuned tactic depends on, except the batch."""

    gpu: str
    sm_count: int
    n: int
    k: int
    weight_dtype: str
    output_dtype: str
    batch_invariant: bool

    @classmethod
    def for_cell(cls, gpu, n: int, k: int, *, weight_dtype: torch.dtype, output_dtype: torch.dtype,
                 batch_invariant: bool) -> "TableKey":
        """The key of ``gpu``'s (a GpuSpec: its name and SM count) table for an N x K weight and these dtypes."""
        return cls(gpu.name, gpu.sm_count, n, k, dtype_name(weight_dtype), dtype_name(output_dtype), batch_invariant)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def key_of(entry: dict) -> TableKey:
    """The key of one JSON entry."""
    return TableKey(
        entry["gpu"], entry["sm_count"], entry["n"], entry["k"],
        entry["weight_dtype"], entry["output_dtype"], entry["batch_invariant"],
    )


def read_regular_file(path) -> bytes:
    """The bytes of ``path``, refused unless it is a regular file: a FIFO would block the read, a device might never
    end it. Checked before opening, and again on what was opened (without blocking) in case the path changed."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{path}: not a regular file")
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError(f"{path}: not a regular file")
        return handle.read()


def read_entries(path) -> list[dict]:
    """The entries of one JSON table file after its format check, each tactic by field name whatever the format."""
    text = read_regular_file(path)
    try:
        document = json.loads(text)
    except RecursionError:  # nesting deeper than the decoder's recursion
        raise ValueError(f"{path}: not a JSON table: nested too deeply") from None
    except ValueError as error:  # not JSON, not UTF-8, or an integer too long to convert
        raise ValueError(f"{path}: not a JSON table: {error}") from None
    found = document.get("format") if isinstance(document, dict) else type(document).__name__
    # Exactly an int: JSON's true and 1.0 compare equal to 1 in Python.
    if type(found) is not int or found not in READABLE_FORMATS:
        raise ValueError(f"{path}: table format {found!r}, expected one of {READABLE_FORMATS}")
    entries = document.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"{path}: a table of format {found} without a list of entries")
    return entries if found == FORMAT else [by_field_name(entry) for entry in entries]


def by_field_name(entry):
    """A format-1 entry with its tactic by field name (left as it is where it is no list of fields: loading reports
    it)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("tactic"), list):
        return entry
    try:
        return {**entry, "tactic": SplitKTactic.from_positions(entry["tactic"]).to_dict()}
    except ValueError:
        return entry


def entry_problem(key: TableKey, batch) -> str | None:
    """What is wrong with the types of an entry's key and batch, if anything (a lookup would never match it)."""
    def is_int(value):
        return isinstance(value, int) and not isinstance(value, bool)

    if not all(isinstance(v, str) for v in (key.gpu, key.weight_dtype, key.output_dtype)):
        return "has a GPU or dtype that is not a string"
    if not all(is_int(v) and v >= 1 for v in (key.sm_count, key.n, key.k, batch)):
        return "has an SM count, N, K or batch that is not a positive int"
    if not isinstance(key.batch_invariant, bool):
        return f"has batch_invariant {key.batch_invariant!r}, not a bool"
    return None


def load_table(path) -> dict:
    """``{TableKey: {batch: SplitKTactic}}`` from one JSON file."""
    table = {}
    for entry in read_entries(path):
        try:
            tactic = as_tactic(SplitKTactic.from_dict(entry["tactic"]))
            key, batch = key_of(entry), entry["batch"]
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"{path}: entry {entry} is no longer valid: {error!r}") from error
        if problem := entry_problem(key, batch):
            raise ValueError(f"{path}: entry {entry} {problem}")
        table.setdefault(key, {})[batch] = tactic
    check_invariant(table, path)
    return table


def check_invariant(table, where) -> None:
    """Batch-invariant entries must keep one summation order per shape, or rows would depend on the batch,
    and the weight as wgmma's A, what the GPU tests verify invariance for."""
    for key, batches in table.items():
        orders = {tactic.summation_order for tactic in batches.values()}
        if key.batch_invariant and any(tactic.weight_as_b for tactic in batches.values()):
            raise ValueError(
                f"{where}: batch-invariant table for {key.n}x{key.k} holds a tactic with the weight as wgmma's B; "
                "batch invariance is verified with the weight as A only"
            )
        if key.batch_invariant and len(orders) > 1:
            raise ValueError(
                f"{where}: batch-invariant table for {key.n}x{key.k} mixes summation orders "
                f"(split, k boxes) {sorted(orders)}"
            )


@cache
def shipped_tables() -> dict:
    """Every table shipped with the package, merged."""
    merged = {}
    for path in sorted(SHIPPED.glob("*.json")):
        for key, batches in load_table(path).items():
            merged.setdefault(key, {}).update(batches)
    check_invariant(merged, SHIPPED)
    return merged


@cache
def user_table(path: str) -> dict:
    """One table named in DECODE_PROJECTION_TABLES, read once per process."""
    try:
        return load_table(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"{USER_TABLES} names {path}, which is not a usable table: {error}") from None


def tables_in_use() -> dict:
    """The shipped tables, where the tables named in DECODE_PROJECTION_TABLES hold a shape (of a GPU, dtypes and
    mode) replaced by theirs, whole: a later path wins, and a batch-invariant shape keeps one summation order."""
    paths = [path for path in os.environ.get(USER_TABLES, "").split(os.pathsep) if path]
    if not paths:
        return shipped_tables()
    merged = dict(shipped_tables())
    for path in paths:
        merged.update(user_table(path))
    return merged


def table_policies(key: TableKey, batches, tables=None) -> dict:
    """The tuned tactics for those of ``batches`` the table covers (possibly none)."""
    found = (tables_in_use() if tables is None else tables).get(key, {})
    return {b: found[b] for b in batches if b in found}


def table_summation_order(key: TableKey, tables=None):
    """The (split, k boxes) a batch-invariant table uses for every batch of its shape, or None."""
    found = (tables_in_use() if tables is None else tables).get(key, {})
    return next(iter(found.values())).summation_order if key.batch_invariant and found else None


def invariant_orders(gpu, shapes, weight_dtype, output_dtype) -> dict:
    """``{(n, k): (split, k boxes)}``: the order ``gpu``'s shipped batch-invariant table sums each of ``shapes`` in,
    where it holds the shape (what a re-tune of the shipped tables keeps)."""
    found = {}
    for n, k in shapes:
        key = TableKey.for_cell(gpu, n, k, weight_dtype=weight_dtype, output_dtype=output_dtype, batch_invariant=True)
        order = table_summation_order(key, shipped_tables())
        if order is not None:
            found[n, k] = order
    return found


def write_table(path, entries, *, dsl_version: str, measured: str) -> None:
    """Write tuned entries (dicts with the TableKey fields, batch, tactic, us) as JSON, each tactic (a SplitKTactic,
    or its fields by name or in order) by field name."""
    stored = [{**entry, "tactic": stored_tactic(entry["tactic"]).to_dict()} for entry in entries]
    document = {
        "format": FORMAT,
        "cutlass_dsl": dsl_version,
        "measured": measured,
        "entries": sorted(stored, key=lambda e: (e["n"], e["k"], e["batch_invariant"], e["batch"])),
    }
    # Through a temporary file and a rename: a tune killed mid-write keeps the table it had.
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n")
    temporary.replace(path)
