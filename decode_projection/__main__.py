"""Command line: ``python -m decode_projection bench``, ``warm``, ``tune`` and ``tables``."""

import argparse
import datetime
import logging
import os
import platform
import sys
from pathlib import Path

import torch

from .cli_args import SHIPPED_ORDERS, batch_list, context_list, epilogue_list, pinned_order, positive_int, shape
from .policy.workload import DECODE_BATCHES, KIMI_K3_SHAPES

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def configure_logging(verbose: bool) -> None:
    """The library's messages on stderr: INFO (which tables it used, the tuner's progress), DEBUG with ``-v``
    (every compile). Only the command line configures logging; the library never does."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("decode_projection").setLevel(logging.DEBUG if verbose else logging.INFO)


def hopper_available():
    """Whether a compute capability 9.0 GPU is present."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def render(cells, meta, args):
    """Print the tables and write the requested CSV, JSON and plot."""
    from .measure.report import format_markdown, format_tables, plot, write_csv, write_json
    from .measure.clocks import describe

    print(f"{meta['gpu']} ({meta['sm_count']} SMs), torch {meta['torch']}, CUDA {meta['cuda']}, "
          f"CuTe DSL {meta['cutlass_dsl']}, {meta['date']}; {meta['method']}")
    print(describe(meta.get("clocks")))
    print(format_tables(cells))
    if args.markdown:
        for context in dict.fromkeys(c.context for c in cells):
            for policy in dict.fromkeys(c.policy for c in cells if c.context == context):
                print(f"\n{policy}, {context}:\n" + format_markdown(cells, policy=policy, context=context))
    if args.csv:
        write_csv(args.csv, cells)
    if args.json:
        write_json(args.json, cells, meta)
    if args.plot:
        plot(args.plot, cells, f"{meta['gpu']}, {meta['date']}: cold L2, CUDA-graph replay")


def bench(args):
    """Time the workload, or compile it and report when there is no Hopper GPU."""
    from .measure.bench import LAUNCHES, run_benchmark
    from .measure.report import load_json

    if args.from_json:
        try:
            saved = load_json(args.from_json)
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"bench: cannot read a saved run from {args.from_json}: {error!r}", file=sys.stderr)
            return 2
        render(*saved, args)
        return 0
    from .measure.timing import PDL_GLUE

    if args.epilogue:
        return bench_epilogues(args)
    kinds = args.policies.split(",")
    launches = args.launch.split(",")
    weight_dtype, output_dtype = DTYPES[args.dtype], DTYPES[args.out_dtype]
    if not hopper_available():
        from .measure.compile_report import compile_report

        print(f"No Hopper GPU here: compiling the kernels the {args.policies} policies need for sm_90a.")
        print(compile_report(args.shape, args.batches, kinds, weight_dtype=weight_dtype, output_dtype=output_dtype))
        if PDL_GLUE in args.context:
            from .measure.glue import compile_glue
            from .runtime.sass import kernel_report

            glue = kernel_report(compile_glue(weight_dtype, "sm_90a"))
            print(f"The PDL-aware glue kernel of the {PDL_GLUE} context: {glue.registers} registers, "
                  f"{glue.spills} spills.")
        print("Timing needs a Hopper GPU (H100/H200); the kernels above compile and disassemble cleanly.")
        unwritten = [f"--{option} {getattr(args, option)}" for option in ("csv", "json", "plot") if getattr(args, option)]
        if unwritten:
            print(f"Nothing timed, so nothing written for {', '.join(unwritten)}.")
        return 0
    import cutlass

    from .measure.clocks import ClockLog
    from .measure.timing import CONTEXTS

    clocks = ClockLog(torch.cuda.current_device())
    cells = run_benchmark(args.shape, args.batches, kinds, weight_dtype=weight_dtype, output_dtype=output_dtype,
                          contexts=args.context, programmatic_launches=[LAUNCHES[name] for name in launches],
                          clocks=clocks)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    meta = {
        "gpu": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cutlass_dsl": cutlass.__version__, "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "method": "cold L2 (weight copies > 3x L2), CUDA-graph replay, median; launch contexts: "
        + "; ".join(f"{context}: {CONTEXTS[context]}" for context in args.context)
        + " (a glue kernel's own time, measured alone, subtracted)",
        "contexts": args.context,
        "clocks": clocks.summary(),
    }
    render(cells, meta, args)
    return 0


def bench_epilogues(args):
    """Time each fused epilogue next to the projection and the PyTorch op it replaces (measure/epilogue_bench.py)."""
    from .measure.epilogue_bench import DEFAULT_SHAPES, bench_epilogues as run, epilogue_records, epilogue_table

    if not hopper_available():
        print("The epilogue benchmark needs a Hopper GPU (H100/H200).", file=sys.stderr)
        return 2
    cells = []
    for epilogue in args.epilogue:
        cells += run(args.shape or DEFAULT_SHAPES[epilogue], args.batches, [epilogue], contexts=args.context,
                     weight_dtype=DTYPES[args.dtype], output_dtype=DTYPES[args.out_dtype])
    print(f"{torch.cuda.get_device_name()}, {datetime.date.today().isoformat()}; cold L2, CUDA-graph replay, "
          "medians; a residual of its own row pitch, a bias of the output's dtype")
    print(epilogue_table(cells))
    if args.json:
        import json

        with open(args.json, "w") as file:
            json.dump({"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                       "cells": epilogue_records(cells)}, file, indent=1)
    return 0


def warm(args):
    """Compile every kernel the policies need into the persistent cache, in parallel."""
    from .runtime.disk_cache import cache_dir
    from .runtime import architecture
    from .warmup import compile_all, kernel_jobs

    if cache_dir() is None:
        print("The disk cache is off (DECODE_PROJECTION_DISK_CACHE=0): there is nothing to warm.", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if hopper_available() else None
    arch = architecture(device) if device is not None else "sm_90a"
    jobs = kernel_jobs(args.shape, args.batches, args.policies.split(","), device, arch, DTYPES[args.dtype],
                       DTYPES[args.out_dtype], programmatic_launches=(not args.no_programmatic_launch,))
    print(f"{compile_all(jobs, workers=args.workers)} kernels for {arch} in {cache_dir()}")
    return 0


def tune(args):
    """Tune tactics on this GPU and write a table."""
    if not hopper_available():
        print("Tuning times kernels and needs a Hopper GPU (H100/H200).", file=sys.stderr)
        return 2
    from .runtime.gpu import gpu_spec
    from .policy.tables import invariant_orders, read_entries, shipped_tables
    from .tuning.tune import UnusableOrder
    from .tuning.tune import tune as run_tune

    weight_dtype, output_dtype = DTYPES[args.dtype], DTYPES[args.out_dtype]
    pinned = {}
    if SHIPPED_ORDERS in args.invariant_order:
        gpu = gpu_spec(torch.cuda.current_device())
        pinned = invariant_orders(gpu, args.shape, weight_dtype, output_dtype)
        kept = ", ".join(f"{n}x{k}={split},{boxes}" for (n, k), (split, boxes) in pinned.items())
        print(f"the shipped batch-invariant orders: {kept or 'none for these shapes'}")
    pinned.update(order for order in args.invariant_order if order != SHIPPED_ORDERS)
    try:
        run_tune(args.shape, args.batches, weight_dtype=weight_dtype, output_dtype=output_dtype,
                 limit=args.candidates, out_path=args.out, timings_path=args.timings,
                 invariant_limit=args.invariant_candidates if args.batch_invariant_out else None,
                 invariant_out_path=args.batch_invariant_out,
                 incumbents=None if args.ignore_shipped else shipped_tables(),
                 kept_entries=read_entries(args.out) if args.update else (), pinned_orders=pinned,
                 contexts=args.context, resume=args.resume)
    except UnusableOrder as error:
        print(f"tune: {error}", file=sys.stderr)
        return 2
    return 0


def tables(args, parser):
    """``tables replace | merge | diff`` (table_tools); a file that is not what it must be is a usage error."""
    from .tuning import table_tools

    try:
        if args.table_command == "replace":
            print(table_tools.replace_shapes(args.table, args.tuned))
        elif args.table_command == "merge":
            print(table_tools.merge_runs(args.files, args.out))
        else:
            print(table_tools.diff(args.tables, args.timings, args.most))
    except (OSError, ValueError) as error:
        parser.error(f"tables {args.table_command}: {error}")
    return 0


def main(argv=None):
    """Parse arguments and run a subcommand."""
    parser = argparse.ArgumentParser(prog="python -m decode_projection", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="also log every kernel compile (DEBUG)")
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub):
        sub.add_argument("--shape", type=shape, action="append",
                         help="NxK weight shape (repeatable); default: the Kimi-K3 decode shapes")
        sub.add_argument("--batches", type=batch_list, default=list(DECODE_BATCHES),
                         help="padded batches, comma-separated (default: %(default)s)")
        sub.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16", help="weight and activation dtype")
        sub.add_argument("--out-dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="output dtype")

    run_bench = commands.add_parser("bench", help="time this projection next to torch.matmul and the read ceiling")
    common(run_bench)
    run_bench.add_argument("--policies", default="tuned",
                           help="comma-separated: tuned, heuristic, batch-invariant (default: %(default)s)")
    run_bench.add_argument("--csv", help="write every cell as CSV")
    run_bench.add_argument("--json", help="write every cell and the run's metadata as JSON")
    run_bench.add_argument("--plot", help="write a PNG of time against batch per shape and launch context")
    run_bench.add_argument("--from-json", help="re-render the tables and plot of a run saved with --json")
    run_bench.add_argument("--markdown", action="store_true", help="also print a compact Markdown summary")
    run_bench.add_argument("--context", type=context_list,
                           help="launch contexts, comma-separated: chain (back to back), pdl-glue (after a PDL-aware "
                                "elementwise kernel that writes the activations), glue (after a plain PyTorch "
                                "elementwise kernel) (default: all three)")
    run_bench.add_argument("--isolated", action="store_true", help="the same as --context glue")
    run_bench.add_argument("--epilogue", type=epilogue_list,
                           help="time fused epilogues instead, comma-separated: residual, bias, silu-mul (each "
                                "next to the projection alone, the projection then the op, and PyTorch's own form; "
                                "default shapes: the Kimi-K3 projections that join the residual stream, and the "
                                "gate/up halves for silu-mul, whose --shape is one half)")
    run_bench.add_argument("--launch", default="programmatic",
                           help="comma-separated: programmatic (with programmatic dependent launch), plain "
                                "(programmatic_launch=False; cells labelled <policy>/plain) (default: %(default)s)")
    run_warm = commands.add_parser("warm", help="compile every kernel the policies need into the persistent cache")
    common(run_warm)
    run_warm.add_argument("--policies", default="tuned",
                          help="comma-separated: tuned, heuristic, batch-invariant (default: %(default)s)")
    run_warm.add_argument("--workers", type=positive_int, help="compiling processes (default: one per CPU, at most 16)")
    run_warm.add_argument("--no-programmatic-launch", action="store_true",
                          help="the kernels for projections prepared with programmatic_launch=False")
    run_tune = commands.add_parser("tune", help="tune tactics on this GPU and write a JSON table")
    common(run_tune)
    run_tune.add_argument("--candidates", type=positive_int, default=8,
                          help="tactics timed per cell (default: %(default)s)")
    run_tune.add_argument("--out", required=True, help="path of the JSON table to write")
    run_tune.add_argument("--batch-invariant-out",
                          help="also write a batch-invariant table (one split and K-box count per shape) here")
    run_tune.add_argument("--invariant-candidates", type=positive_int, default=6,
                          help="tactics with the pinned summation order timed per cell (default: %(default)s)")
    run_tune.add_argument("--invariant-order", type=pinned_order, action="append", default=[],
                          help="NxK=split,kboxes (repeatable): the batch-invariant table's summation order for "
                               "that shape, instead of the tuner's choice; 'shipped': the shipped table's order "
                               "for every tuned shape it holds (an NxK=... given too wins)")
    run_tune.add_argument("--timings", help="also write every candidate's time as JSON")
    run_tune.add_argument("--ignore-shipped", action="store_true",
                          help="do not time the shipped tables' tactics next to the new candidates")
    run_tune.add_argument("--update", action="store_true",
                          help="keep the cells of the existing --out table that this run does not tune (every shape "
                               "given is tuned; --resume skips those --out already holds)")
    run_tune.add_argument("--resume", action="store_true",
                          help="go on with a tune that was cut short: shapes whose every batch is already in --out "
                               "(and --batch-invariant-out) are kept, not tuned again, with their --timings rows; "
                               "without those files, the same as a fresh tune")
    run_tune.add_argument("--context", type=context_list,
                          help="launch contexts each candidate is timed in, scored by the geometric mean of its "
                               "times in them (names as for bench; default: all three)")
    run_tables = commands.add_parser("tables", help="replace shapes of, merge or compare tuned tables")
    table_commands = run_tables.add_subparsers(dest="table_command", required=True)
    replace_shapes = table_commands.add_parser("replace", help="the shapes TUNED holds replace TABLE's, in place")
    replace_shapes.add_argument("table", help="the table to update in place")
    replace_shapes.add_argument("tuned", help="a table whose shapes replace the table's")
    merge = table_commands.add_parser("merge", help="per cell the faster tactic of two tables, by their benchmarks")
    merge.add_argument("files", nargs="+", help="table A, its benchmark JSONs, table B, its benchmark JSONs")
    merge.add_argument("--out", required=True, help="path of the merged table")
    compare = table_commands.add_parser("diff", help="the cells a re-tune changed, largest gain first")
    compare.add_argument("tables", nargs="+", help="old and new table, in pairs")
    compare.add_argument("--timings", required=True, help="the re-tune's --timings JSON")
    compare.add_argument("--most", type=positive_int, default=8, help="cells in the probe list (default: %(default)s)")
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    if args.command == "tables":
        return tables(args, parser)
    if args.command == "tune" and args.update and args.batch_invariant_out:
        parser.error("--update re-tunes some cells of a free table; a batch-invariant order needs every batch")
    if args.command == "tune" and args.update and not Path(args.out).is_file():
        parser.error(f"--update keeps the cells of --out, and there is no table at {args.out}")
    if args.command == "tune" and (args.update or args.resume):
        from .policy.tables import load_table

        flag = "--update" if args.update else "--resume"
        for option in ("out", "batch_invariant_out") if args.resume else ("out",):
            path = getattr(args, option)
            if path and (args.update or Path(path).exists()):
                try:  # every entry, as the run will write them back
                    load_table(path)
                except (OSError, ValueError) as error:
                    parser.error(f"{flag} keeps the cells of --{option.replace('_', '-')}, which is not a table: "
                                 f"{error}")
    # Output paths are written after the run: refuse those that cannot be before it starts.
    for option in ("csv", "json", "plot", "out", "batch_invariant_out", "timings"):
        path = getattr(args, option, None)
        flag = f"--{option.replace('_', '-')} {path}"
        if path and not Path(path).resolve().parent.is_dir():
            parser.error(f"{flag}: no such directory")
        if path and Path(path).is_dir():
            parser.error(f"{flag}: is a directory")
        if path and not os.access(Path(path).resolve().parent, os.W_OK):
            parser.error(f"{flag}: its directory is not writable")
    if not (args.command == "bench" and args.epilogue):  # the epilogues have shapes of their own
        args.shape = args.shape or list(KIMI_K3_SHAPES)
    if args.command == "tune" and args.invariant_order:
        if not args.batch_invariant_out:
            parser.error("--invariant-order pins the batch-invariant table's order: give --batch-invariant-out")
        pinned = [order if order == SHIPPED_ORDERS else order[0] for order in args.invariant_order]
        named = [weight for weight in pinned if weight != SHIPPED_ORDERS]
        stray = [f"{n}x{k}" for n, k in named if (n, k) not in args.shape]
        if stray:
            parser.error(f"--invariant-order for shapes this run does not tune: {', '.join(stray)}")
        if len(set(pinned)) < len(pinned):
            parser.error("--invariant-order names a shape (or 'shipped') twice")
    if args.command == "bench" and args.isolated and args.context:
        parser.error("--isolated is --context glue: give one of them")
    if args.command in ("bench", "tune"):
        from .measure.timing import CONTEXTS, GLUE

        args.context = [GLUE] if getattr(args, "isolated", False) else args.context or list(CONTEXTS)
    if args.command in ("bench", "warm"):
        from .measure.bench import LAUNCHES
        from .warmup import POLICY_KINDS

        unknown = set(args.policies.split(",")) - set(POLICY_KINDS)
        if unknown:
            parser.error(f"unknown policies {sorted(unknown)}")
        if args.command == "bench":
            unknown = set(args.launch.split(",")) - set(LAUNCHES)
            if unknown:
                parser.error(f"unknown launches {sorted(unknown)}")
    return {"bench": bench, "warm": warm, "tune": tune}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
