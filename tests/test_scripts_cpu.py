"""The measurement scripts and the table tools: speed bars, two sets of runs compared, merging tuned tables by
benchmark, replacing shapes, the cells a re-tune changed, profile summaries."""

import gzip
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from decode_projection import SplitKTactic
from decode_projection.__main__ import main
from decode_projection.measure.report import median_cells
from decode_projection.runtime.gpu import H100
from decode_projection.tuning import table_tools

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name, folder=None):
    """Import <folder, default scripts/>/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, (folder or SCRIPTS) / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cell(n, k, batch, us, cublas_us, policy="tuned", context="chain", ceiling_us=None):
    return {"n": n, "k": k, "batch": batch, "us": us, "cublas_us": cublas_us, "policy": policy, "context": context,
            "ceiling_us": ceiling_us}


def test_speed_bars_count_each_bar():
    bars = load_script("speed_bars")
    fast = cell(2112, 7168, 1, 8.0, 12.6)  # under the 8.4 us floor
    slow = cell(2112, 7168, 2, 13.0, 12.6)  # misses bars 1 and 2
    big = cell(20480, 7168, 1, 70.0, 77.0)  # 293.6 MB in 70 us: 4.19 TB/s < 4.2
    heavy = cell(2112, 7168, 256, 20.0, 17.0)  # more than 5% slower at a compute-bound batch
    found, geomean, streaming = bars.misses([fast, slow, big, heavy])
    assert streaming == 3
    assert [len(found[bar]) for bar in (1, 2, 3, 4)] == [2, 1, 1, 1]
    assert "2112x7168 M=2" in found[2][0] and "20480x7168 M=1" in found[3][0]
    assert abs(geomean - (12.6 / 8.0 * 12.6 / 13.0 * 77.0 / 70.0) ** (1 / 3)) < 1e-12


def test_speed_bar_1_takes_the_larger_of_the_byte_floor_and_the_ceiling_of_the_same_context():
    bars = load_script("speed_bars")
    floor = (2112 * 7168 + 7168) * 2 / 4.4e6  # 6.89 us
    # Chain and pdl-glue: 1.5 us over the floor, or 0.3 us over the ceiling; glue: 2.2 us, or 0.5 us.
    assert bars.bar1_limit_us(cell(2112, 7168, 1, 9.0, 12.0)) == floor + 1.5
    assert bars.bar1_limit_us(cell(2112, 7168, 1, 9.0, 12.0, context="pdl-glue", ceiling_us=8.5)) == 8.5 + 0.3
    assert bars.bar1_limit_us(cell(2112, 7168, 1, 9.0, 12.0, context="glue", ceiling_us=8.5)) == floor + 2.2
    assert bars.bar1_limit_us(cell(2112, 7168, 1, 9.0, 12.0, context="glue", ceiling_us=9.0)) == 9.0 + 0.5
    # Off the H200 only the ceiling counts; without one there is nothing to judge by.
    assert bars.bar1_limit_us(cell(2112, 7168, 1, 9.0, 12.0, ceiling_us=6.0), absolute=False) == 6.3
    assert bars.bar1_limit_us(cell(2112, 7168, 1, 9.0, 12.0), absolute=False) is None
    # 9.0 us misses after the PDL-aware glue (limit 8.8) but not after the plain one (9.5); bar 3 holds only in
    # chain and pdl-glue.
    ceiling = 8.5
    after = {context: bars.misses([cell(2112, 7168, 1, 9.0, 12.0, context=context, ceiling_us=ceiling),
                                   cell(20480, 7168, 1, 70.0, 77.0, context=context, ceiling_us=70.0)])[0]
             for context in ("pdl-glue", "glue")}
    assert [len(after["pdl-glue"][bar]) for bar in (1, 3)] == [1, 1]
    assert [len(after["glue"][bar]) for bar in (1, 3)] == [0, 0]


def test_the_read_ceilings_own_speedup_is_judged_at_streaming_batches_only():
    bars = load_script("speed_bars")
    cells = [cell(2112, 7168, 1, 9.0, 12.0, ceiling_us=8.0), cell(2112, 7168, 8, 9.0, 13.5, ceiling_us=9.0),
             cell(2112, 7168, 256, 20.0, 17.0, ceiling_us=10.0)]
    assert abs(bars.ceiling_speedup(cells) - 1.5) < 1e-12
    assert bars.ceiling_speedup([cell(2112, 7168, 1, 9.0, 12.0)]) is None  # a cell without a ceiling


def test_speed_bars_judge_several_runs_on_each_cells_medians():
    runs = [[cell(2112, 7168, 1, us, cublas, ceiling_us=ceiling)]
            for us, cublas, ceiling in ((8.0, 12.0, 7.0), (9.5, 12.6, 7.4), (8.2, 13.0, 7.2))]
    (one,) = median_cells(runs)
    assert (one["us"], one["cublas_us"], one["ceiling_us"]) == (8.2, 12.6, 7.2)
    # The median of each policy's and each context's cells, not of the runs' mix.
    mixed = median_cells([[cell(2112, 7168, 1, 8.0, 12.0), cell(2112, 7168, 1, 9.0, 12.0, "batch-invariant"),
                           cell(2112, 7168, 1, 10.0, 12.0, context="glue")]] * 3)
    assert sorted(c["us"] for c in mixed) == [8.0, 9.0, 10.0]


def write_bench(path, gpu, cells, method="cold L2"):
    path.write_text(json.dumps({"meta": {"gpu": gpu, "method": method}, "cells": cells}))
    return str(path)


def test_speed_bars_want_three_runs_of_one_gpu_and_use_its_own_ceiling_off_the_h200(tmp_path, monkeypatch, capsys):
    bars = load_script("speed_bars")
    # Faster than torch.matmul everywhere (geometric means over 1.35x in chain, 1.22x after glue). In chain, 2112 x 7168
    # runs under the byte floor plus 1.5 us (8.39) but over its ceiling plus 0.3 (7.3), 20480 x 7168 over both and
    # under 4.2 TB/s; after glue, only 20480 x 7168 runs over its limit (90.5 us).
    cells = [cell(2112, 7168, 1, 8.0, 14.0, ceiling_us=7.0), cell(20480, 7168, 1, 90.0, 130.0, ceiling_us=89.0),
             cell(2112, 7168, 1, 11.4, 15.0, context="glue", ceiling_us=11.0),
             cell(20480, 7168, 1, 93.0, 130.0, context="glue", ceiling_us=90.0)]
    h200 = [write_bench(tmp_path / f"h200-{run}.json", "NVIDIA H200", cells) for run in range(3)]
    h100 = [write_bench(tmp_path / f"h100-{run}.json", "NVIDIA H100 80GB HBM3", cells) for run in range(3)]
    monkeypatch.setattr("sys.argv", ["speed_bars", *h200])
    assert bars.main() == 1
    out = capsys.readouterr().out
    assert "tuned chain: geometric mean at M<=64 1.590x over 2 cells; misses bar 1: 1 cells, bar 2: 0 cells, " \
        "bar 3: 1 cells, bar 4: 0 cells" in out
    assert "tuned glue: geometric mean at M<=64 1.356x over 2 cells; misses bar 1: 1 cells, bar 2: 0 cells, " \
        "bar 3: 0 cells, bar 4: 0 cells" in out
    # On an H100 bar 1 takes the ceiling of the same run alone, and bar 3 is not judged.
    monkeypatch.setattr("sys.argv", ["speed_bars", *h100])
    assert bars.main() == 1
    out = capsys.readouterr().out
    assert "these runs are on NVIDIA H100 80GB HBM3: bar 1 judged by the read ceiling" in out
    assert "tuned chain: geometric mean at M<=64 1.590x over 2 cells; misses bar 1: 2 cells, bar 2: 0 cells, " \
        "bar 4: 0 cells" in out and "bar 3" not in out.split("not judged")[1]
    assert "tuned glue: geometric mean at M<=64 1.356x over 2 cells; misses bar 1: 1 cells" in out
    # Fewer than three runs: refused, unless asked for a look.
    monkeypatch.setattr("sys.argv", ["speed_bars", *h200[:2]])
    with pytest.raises(SystemExit):
        bars.main()
    assert "at least 3 runs" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["speed_bars", h200[0], "--fewer-runs"])
    assert bars.main() == 1 and "a look, not a verdict" in capsys.readouterr().out
    # The medians of two GPUs' runs would mean nothing.
    monkeypatch.setattr("sys.argv", ["speed_bars", *h200, h100[0]])
    with pytest.raises(SystemExit):
        bars.main()
    assert "different GPUs" in capsys.readouterr().err


def test_card_bar_off_the_h200_takes_the_read_ceilings_fastest_rate_on_large_weights(tmp_path, monkeypatch, capsys):
    bars = load_script("speed_bars")
    # The read ceiling streams 20480 x 7168 (293.6 MB) back to back in 95.4 us: 3.078 TB/s. Neither the small
    # weight's faster-looking rate (393 KB in 0.05 us) nor a faster ceiling after glue sets the rate.
    cells = [cell(20480, 7168, 1, 95.5, 130.0, ceiling_us=95.4),
             cell(1536, 128, 1, 0.3, 3.0, ceiling_us=0.05),
             cell(2112, 7168, 64, 12.5, 20.0, ceiling_us=12.5),  # within its own ceiling + 0.3, over the card bar
             cell(2112, 7168, 96, 13.0, 20.0, ceiling_us=12.9),  # over the card bar, past the streaming batches
             cell(20480, 7168, 1, 60.0, 130.0, context="glue", ceiling_us=60.0)]
    rate = bars.read_ceiling_bytes_per_us(cells)
    assert rate == 20480 * 7168 * 2 / 95.4
    assert bars.read_ceiling_bytes_per_us(cells[1:4]) is None  # no weight of 50 MB or more
    # Limits: 97.40 us (20480 x 7168 M=1), 2.13 (1536 x 128 M=1), 12.14 (2112 x 7168 M=64).
    assert bars.card_limit_us(cells[2], rate) == pytest.approx((2112 + 64) * 7168 * 2 / rate + 2.0)
    assert bars.card_bar_misses(cells, rate) == ["2112x7168 M=64: 12.50 us > 12.14"]
    # Every other bar holds, so the card bar alone fails the runs.
    runs = [write_bench(tmp_path / f"h100-{run}.json", "NVIDIA H100 80GB HBM3", cells) for run in range(3)]
    monkeypatch.setattr("sys.argv", ["speed_bars", *runs])
    assert bars.main() == 1
    out = capsys.readouterr().out
    assert "tuned chain: geometric mean at M<=64 2.793x over 3 cells; misses bar 1: 0 cells, bar 2: 0 cells, " \
        "bar 4: 0 cells" in out and "tuned glue: geometric mean at M<=64 2.167x over 1 cells; misses bar 1: 0" in out
    assert "tuned chain, card bar: time <= bytes / 3.078 TB/s (this read ceiling) + 2.0 us at M<=64: misses 1 " \
        "cells\n  card  2112x7168 M=64" in out
    # Runs without a large weight say the card bar was not judged; on the H200 the absolute bars hold instead.
    runs = [write_bench(tmp_path / f"small-{run}.json", "NVIDIA H100 80GB HBM3", cells[1:3]) for run in range(3)]
    monkeypatch.setattr("sys.argv", ["speed_bars", *runs])
    assert bars.main() == 0 and "card bar not judged" in capsys.readouterr().out
    runs = [write_bench(tmp_path / f"h200-{run}.json", "NVIDIA H200", cells) for run in range(3)]
    monkeypatch.setattr("sys.argv", ["speed_bars", *runs])
    bars.main()
    assert "card bar" not in capsys.readouterr().out


def test_speed_bars_read_runs_saved_before_cells_had_contexts(tmp_path, monkeypatch, capsys):
    bars = load_script("speed_bars")
    old = [{key: value for key, value in cell(2112, 7168, 1, 8.0, 12.0).items() if key != "context"}]
    runs = [write_bench(tmp_path / f"{run}.json", "NVIDIA H200", old, method) for run, method in
            enumerate(["cold L2, back to back", "cold L2, a small foreign kernel before every launch (subtracted)"])]
    monkeypatch.setattr("sys.argv", ["speed_bars", *runs, "--fewer-runs"])
    assert bars.main() == 0
    out = capsys.readouterr().out
    assert "tuned chain: geometric mean at M<=64 1.500x over 1 cells" in out
    assert "tuned glue: geometric mean at M<=64 1.500x over 1 cells" in out


def test_batch_invariant_allowance_is_ten_percent_over_tuned_per_cell_and_context():
    bars = load_script("speed_bars")
    cells = [cell(3072, 7168, 4, 12.0, 15.0), cell(3072, 7168, 4, 13.4, 15.0, "batch-invariant"),
             cell(3072, 7168, 8, 12.0, 15.0), cell(3072, 7168, 8, 13.1, 15.0, "batch-invariant"),
             cell(3072, 7168, 8, 11.0, 15.0, context="glue"),
             cell(3072, 7168, 8, 13.1, 15.0, "batch-invariant", context="glue"),
             cell(3072, 7168, 256, 20.0, 21.0), cell(3072, 7168, 256, 30.0, 21.0, "batch-invariant")]
    over = bars.invariant_excess(cells)
    assert len(over) == 2 and "chain 3072x7168 M=4" in over[0] and "1.12 x tuned" in over[0]
    assert "glue 3072x7168 M=8" in over[1] and "1.19 x tuned" in over[1]


def entry(n, batch, tactic, invariant=False):
    """A table entry of format 2 (the tactic by field name)."""
    return {"gpu": "NVIDIA H200", "sm_count": 132, "n": n, "k": 7168, "weight_dtype": "bfloat16",
            "output_dtype": "bfloat16", "batch_invariant": invariant, "batch": batch, "tactic": tactic.to_dict(),
            "us": 1.0}


def write_run(tmp_path, name, entries, times, policy, source="table", *, run_format=2):
    """A table and its two benchmark files; ``times`` maps (n, batch) to microseconds. A run of format 1 stores its
    tactics as lists of their fields."""
    table = tmp_path / f"{name}.json"
    table.write_text(json.dumps({"format": 2, "entries": entries}))
    ran = {(e["n"], e["batch"]): e["tactic"] for e in entries}
    as_stored = dict if run_format == 2 else (lambda tactic: list(tactic.values()))
    cells = [dict(cell(n, 7168, batch, us, 10.0, policy), source=source, tactic=as_stored(ran[n, batch]))
             for (n, batch), us in times.items()]
    paths = [table]
    for context in ("bench", "isolated"):
        path = tmp_path / f"{name}-{context}.json"
        path.write_text(json.dumps({"format": run_format, "meta": {}, "cells": cells}))
        paths.append(path)
    return paths


def run_merge(a, b, out):
    assert main(["tables", "merge", *map(str, a), *map(str, b), "--out", str(out)]) == 0
    return {(e["n"], e["batch"]): SplitKTactic.from_dict(e["tactic"]) for e in json.loads(out.read_text())["entries"]}


SPLIT_4, SPLIT_8 = SplitKTactic(128, 8, 4, 13), SplitKTactic(64, 8, 8, 6)


@pytest.mark.parametrize("run_format", [1, 2])
def test_merge_takes_the_faster_tactic_per_cell(tmp_path, capsys, monkeypatch, run_format):
    a = write_run(tmp_path, "a", [entry(1536, 1, SPLIT_4), entry(1536, 2, SPLIT_4)],
                  {(1536, 1): 5.0, (1536, 2): 7.0}, "tuned", run_format=run_format)
    b = write_run(tmp_path, "b", [entry(1536, 1, SPLIT_8), entry(1536, 2, SPLIT_8), entry(1536, 4, SPLIT_8)],
                  {(1536, 1): 6.0, (1536, 2): 6.5, (1536, 4): 6.5}, "tuned", run_format=run_format)
    merged = run_merge(a, b, tmp_path / "merged.json")
    # Batch 4 only table b has: it is kept, not dropped.
    assert merged == {(1536, 1): SPLIT_4, (1536, 2): SPLIT_8, (1536, 4): SPLIT_8}
    assert "1 from" in capsys.readouterr().out


def test_merge_scores_a_cell_by_the_geometric_mean_over_the_contexts_of_one_benchmark(tmp_path, capsys):
    runs = []
    for name, tactic, chain, glue in (("a", SPLIT_4, 5.0, 9.0), ("b", SPLIT_8, 6.0, 7.0)):
        table, bench = tmp_path / f"{name}.json", tmp_path / f"{name}-bench.json"
        table.write_text(json.dumps({"format": 2, "entries": [entry(1536, 1, tactic)]}))
        cells = [dict(cell(1536, 7168, 1, us, 10.0, context=context), source="table", tactic=tactic.to_dict())
                 for context, us in (("chain", chain), ("glue", glue))]
        bench.write_text(json.dumps({"format": 2, "meta": {}, "cells": cells}))
        runs.append([table, bench])
    # a is faster back to back, b after glue and by the geometric mean (6.48 us against 6.71).
    assert run_merge(*runs, tmp_path / "merged.json") == {(1536, 1): SPLIT_8}
    with pytest.raises(SystemExit):
        run_merge(runs[0][::-1], runs[1], tmp_path / "merged.json")
    assert "first file must be a table" in capsys.readouterr().err


def test_merge_refuses_tables_of_several_gpus_or_dtypes(tmp_path, capsys):
    a = write_run(tmp_path, "a", [entry(1536, 1, SPLIT_4)], {(1536, 1): 5.0}, "tuned")
    fp32 = {**entry(1536, 1, SPLIT_8), "output_dtype": "float32"}
    b = write_run(tmp_path, "b", [fp32], {(1536, 1): 6.0}, "tuned")
    with pytest.raises(SystemExit):
        run_merge(a, b, tmp_path / "merged.json")
    assert "one GPU, dtype pair and mode" in capsys.readouterr().err


def test_merge_ignores_times_of_tactics_the_table_does_not_hold(tmp_path, monkeypatch):
    # Table a's benchmark fell back to the heuristic: its fast time says nothing about table a's tactic.
    a = write_run(tmp_path, "a", [entry(1536, 1, SPLIT_4)], {(1536, 1): 1.0}, "tuned", source="heuristic")
    b = write_run(tmp_path, "b", [entry(1536, 1, SPLIT_8)], {(1536, 1): 6.0}, "tuned")
    assert run_merge(a, b, tmp_path / "merged.json") == {(1536, 1): SPLIT_8}


def test_merge_keeps_one_summation_order_per_shape_when_batch_invariant():
    tables = [
        {"entries": [entry(1536, 1, SPLIT_4, True), entry(1536, 2, SPLIT_4, True)]},
        {"entries": [entry(1536, 1, SPLIT_8, True), entry(1536, 2, SPLIT_8, True)]},
    ]
    # Run b wins batch 1 alone but loses the shape as a whole: all of run a's entries stay.
    scores = [{(1536, 7168, 1): 5.0, (1536, 7168, 2): 5.0}, {(1536, 7168, 1): 4.0, (1536, 7168, 2): 9.0}]
    merged, counts = table_tools.merge(tables, scores, batch_invariant=True)
    assert {SplitKTactic.from_dict(e["tactic"]) for e in merged} == {SPLIT_4} and counts == [2, 0]


def test_replace_shapes_swaps_whole_shapes_and_keeps_the_rest(tmp_path, capsys):
    table, tuned = tmp_path / "table.json", tmp_path / "tuned.json"
    # Format-1 tables (tactics as lists of their fields): the result is written in format 2.
    old = [{**entry(n, b, SplitKTactic(64, 8, 2, 4), invariant=True), "tactic": [64, 8, 2, 4, 1]}
           for n in (1536, 2112) for b in (1, 8)]
    table.write_text(json.dumps({"format": 1, "cutlass_dsl": "4.8.1", "measured": "2026-12-01", "entries": old}))
    # One batch: the shape's other cells go too.
    new = [{**entry(2112, 1, SplitKTactic(64, 8, 4, 4), invariant=True), "tactic": [64, 8, 4, 4, 1]}]
    tuned.write_text(json.dumps({"format": 1, "cutlass_dsl": "4.8.1", "measured": "2026-12-03", "entries": new}))
    assert main(["tables", "replace", str(table), str(tuned)]) == 0
    document = json.loads(table.read_text())
    assert document["format"] == 2
    assert {(e["n"], e["batch"]): e["tactic"]["split"] for e in document["entries"]} == {
        (1536, 1): 2, (1536, 8): 2, (2112, 1): 4}
    assert document["measured"] == "2026-12-03"
    assert "1 shapes replaced (1 cells), 2 cells kept" in capsys.readouterr().out
    # A free table's cells never go into a batch-invariant one.
    tuned.write_text(json.dumps({"format": 2, "cutlass_dsl": "4.8.1", "measured": "2026-12-03",
                                 "entries": [entry(2112, 1, SplitKTactic(64, 8, 4, 4))]}))
    with pytest.raises(SystemExit):
        main(["tables", "replace", str(table), str(tuned)])
    assert json.loads(table.read_text()) == document
    # A merge that would not load (a tactic no kernel can run) leaves the table as it was.
    tuned.write_text(json.dumps({"format": 2, "cutlass_dsl": "4.8.1", "measured": "2026-12-03",
                                 "entries": [entry(2112, 1, SplitKTactic(65, 8, 4, 4), invariant=True)]}))
    with pytest.raises(SystemExit):
        main(["tables", "replace", str(table), str(tuned)])
    assert "no longer valid" in capsys.readouterr().err
    assert json.loads(table.read_text()) == document and sorted(tmp_path.iterdir()) == [table, tuned]


def test_profile_summary_pairs_launches_with_labels(tmp_path, capsys):
    profile = load_script("profile_cells")
    labels = tmp_path / "labels.txt"
    labels.write_text("8448x7168 M=1 (128,8,2,13,1,1) L2 256B\n8448x7168 read-only kernel\n")
    header = '"ID","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum","lts__t_sector_op_read_hit_rate.pct"'
    ncu = tmp_path / "ncu.csv"
    ncu.write_text("==PROF== Connected to process 1\n" + header + '\n"","","byte","nsecond","%"\n'
                   '"0","kernel_a","127,401,984","30,000","1.5"\n"1","kernel_b","121,110,528","27,500","0.2"\n')
    profile.summarize(ncu, labels)
    lines = capsys.readouterr().out.splitlines()
    assert "L2 256B" in lines[1] and " 30.00 " in lines[1] and " 1.052 " in lines[1]
    assert "read-only" in lines[2] and " 1.000 " in lines[2] and " 4.40 " in lines[2]


def test_compute_profile_labels_ours_and_names_cublas(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # it shares profile_cells' helpers
    profile = load_script("profile_compute_bound")
    labels = tmp_path / "labels.txt"
    labels.write_text("8448x7168 M=256 (64,256,1,5,1,1)\n")
    columns = ",".join(f'"{m}"' for m in profile.METRICS)
    ncu = tmp_path / "ncu.csv"
    ncu.write_text('"ID","Kernel Name",' + columns + "\n" + '"","",' + ",".join('""' for _ in profile.METRICS) + "\n"
                   '"0","kernel_SplitKGemm_x","46,000","88.5","61.2","70.1","1,500,000,000","1,815,000,000"\n'
                   '"1","sm90_xmma_gemm_bf16","43,900","93.0","40.0","75.0","600,000,000","1,815,000,000"\n')
    profile.summarize(ncu, labels)
    lines = capsys.readouterr().out.splitlines()
    assert "(64,256,1,5,1,1)" in lines[1] and " 46.00 " in lines[1] and " 1815 " in lines[1] and " 88.5 " in lines[1]
    assert "torch.matmul: sm90_xmma_gemm_bf16" in lines[2] and " 43.90 " in lines[2] and " 0.60" in lines[2]


def test_time_tactics_parses_cells_and_flags():
    probe = load_script("time_tactics")
    n, k, batch, tactics = probe.parse_cell("6288x7168:64:128,64,1,9,1,4/96,64,1,11,B/56,8,1,6,4,e/64,8,1,6")
    assert (n, k, batch) == (6288, 7168, 64)
    assert tactics[0].multicast == 4 and not tactics[0].weight_as_b
    assert tactics[1].weight_as_b and (tactics[1].weight_rows, tactics[1].stages) == (96, 11)
    assert tactics[2] == SplitKTactic(56, 8, 1, 6, k_boxes=4, dependents_at_start=True)
    assert tactics[3] == SplitKTactic(64, 8, 1, 6) and tactics[2].label == "(56,8,1,6,4,1,1,E)"


def test_time_tactics_times_gated_candidates_of_the_interleaved_weight(monkeypatch, capsys):
    from decode_projection.kernel.tactic import as_tactic
    from decode_projection.policy.policies import gated_candidates
    from decode_projection.projection import Epilogue
    from decode_projection.runtime.gpu import H100

    probe = load_script("time_tactics")
    texts = ("1536x7168:1:candidates", "1536x7168:64:Candidates", "20x512:4:16,8,1,4")
    cells = [probe.parse_cell(text) for text in texts]
    assert cells[0] == (1536, 7168, 1, None) and cells[1][3] is None
    resolved = probe.with_candidates(cells, H100)
    # A pair of 1536 gate rows interleaves 3072: the kernel's weight is what the candidates are for.
    assert resolved[0][3] == gated_candidates(3072, 7168, 1, H100)[:probe.GATED_CANDIDATES]
    assert len(resolved[1][3]) == probe.GATED_CANDIDATES and resolved[2] == cells[2]
    jobs = probe.compile_jobs(resolved, "sm_90a", (True, False), as_tactic, Epilogue(gated=True))
    assert len(jobs) == 2 * (2 * probe.GATED_CANDIDATES + 1) and {job[-1] for job in jobs} == {Epilogue(gated=True)}
    assert len(probe.compile_jobs(resolved[2:], "sm_90a", (True,), as_tactic)[0]) == 5  # no epilogue: as before
    monkeypatch.setattr("sys.argv", ["time_tactics.py", "1536x7168:1:candidates"])
    with pytest.raises(SystemExit) as refused:  # before it looks for a GPU
        probe.main()
    assert refused.value.code == 2 and "'candidates' in place of the tactics takes --gated" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["time_tactics.py", "--gated", "--residual", "1536x7168:1:32,8,1,12,2"])
    with pytest.raises(SystemExit) as refused:
        probe.main()
    assert refused.value.code == 2 and "--gated takes no residual" in capsys.readouterr().err
    residual_jobs = probe.compile_jobs(resolved[2:], "sm_90a", (True,), as_tactic, Epilogue(residual=True))
    assert residual_jobs[0][-1] == Epilogue(residual=True)


def test_compile_candidates_covers_the_incumbents_and_checks_the_sass():
    script = load_script("compile_candidates")
    from decode_projection.policy.tables import shipped_tables
    from decode_projection.runtime.gpu import KNOWN_GPUS

    # On each card, the shipped tactic of both its tables for 1536 x 128 M=1 is among the candidates, compiled once.
    for gpu in KNOWN_GPUS.values():
        found = script.retune_tactics([(1536, 128)], [1], limit=2, invariant_limit=1, gpu=gpu)
        shipped = {batches[1] for key, batches in shipped_tables().items()
                   if (key.gpu, key.n, key.k) == (gpu.name, 1536, 128)}
        assert shipped and shipped <= found, gpu.name
    tactic, registers, hgmma, utmaldg, spills, _, error = script.check(next(iter(shipped)))
    assert not error and registers > 0 and hgmma > 0 and utmaldg > 0 and spills == 0


def test_ab_check_refuses_a_folder_without_the_package(tmp_path):
    import subprocess

    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "logs"), "AB_TREE": str(tmp_path), "AB_CELLS": "64x128:1:64,8,1,4"}
    done = subprocess.run(["bash", str(SCRIPTS / "ab-check")], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "no decode_projection/" in done.stdout


def test_changed_cells_rank_by_the_same_runs_timings():
    script = table_tools

    a, b, c = SplitKTactic(64, 64, 3, 7), SplitKTactic(64, 64, 3, 5), SplitKTactic(56, 64, 2, 6, k_boxes=2)
    # The same tactic is no change, whether or not a table left out its default fields.
    trimmed = {name: value for name, value in a.to_dict().items() if name != "fold"}
    old = [entry(2112, 64, a), {**entry(2112, 48, a), "tactic": trimmed}, entry(3584, 64, a, True)]
    new = [entry(2112, 64, b), entry(2112, 48, a), entry(3584, 64, c, True)]
    # Scored as the tuner scores: the geometric mean over the contexts each row names (a row of an older file
    # names none: back to back, then after glue).
    timings = [{"n": 2112, "k": 7168, "batch": 64,
                "timed": [[list(a.to_dict().values()), 10.0, 12.0], [list(b.to_dict().values()), 9.9, 11.9]]},
               {"n": 3584, "k": 7168, "batch": 64, "contexts": ["chain", "pdl-glue", "glue"],
                "timed": [[a.to_dict(), 15.0, 16.0, 18.0], [c.to_dict(), 14.4, 15.0, 16.2]]}]
    found = script.changed([(old[:2], new[:2]), (old[2:], new[2:])], timings)
    assert [cell for _, cell, _ in found] == [(3584, 7168, 64), (2112, 7168, 64)]  # 0.93 us, then 0.1
    assert abs(found[0][0] - ((15 * 16 * 18) ** (1 / 3) - (14.4 * 15 * 16.2) ** (1 / 3))) < 1e-9
    assert script.probe_cell(*found[0][1:]) == "3584x7168:64:64,64,3,7,1,1,1/56,64,2,6,2,1,1"
    time_tactics = load_script("time_tactics")
    assert time_tactics.parse_cell(script.probe_cell(*found[0][1:]))[3][1] == SplitKTactic(56, 64, 2, 6, k_boxes=2)


def test_epilogue_bars_judge_each_cells_medians(tmp_path, capsys):
    bars = load_script("epilogue_bars")

    def run(path, fused):
        cells = [{"n": 7168, "k": 1536, "batch": 1, "epilogue": "residual", "context": "glue", "plain_us": 6.0,
                  "fused_us": fused, "separate_us": 8.0, "torch_us": 7.0},
                 {"n": 7168, "k": 1536, "batch": 1, "epilogue": "bias", "context": "chain", "plain_us": 6.0,
                  "fused_us": 6.1, "separate_us": 6.05, "torch_us": None}]
        path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "cells": cells}))
        return str(path)

    # The residual's fused time is judged on its median (6.2, a miss of bar 1 only in the one slow run), the bias's
    # fused form is slower than the projection then out += b (bar 2) in every run.
    files = [run(tmp_path / f"{i}.json", fused) for i, fused in enumerate((6.2, 7.1, 6.2))]
    assert bars.main(files) == 1
    out = capsys.readouterr().out
    assert "bar 2  7168x1536 M=1 bias chain: fused 6.10 us >= separate 6.05" in out
    assert "residual" not in out.split("misses")[0] and "misses bar 1: 0, bar 2: 1, bar 3: 0" in out
    assert bars.main(files[:1]) == 0 and "a look, not a verdict" in capsys.readouterr().out
    # Past M = 64 the bars do not hold: such a cell is shown apart and fails nothing; gzipped runs read the same.
    for i, path in enumerate(files):
        document = json.loads(Path(path).read_text())
        document["cells"] = [{**c, "fused_us": 6.1} for c in document["cells"] if c["epilogue"] == "residual"]
        document["cells"].append({**document["cells"][0], "batch": 96, "fused_us": 9.0})
        with gzip.open(tmp_path / f"{i}.json.gz", "wt") as handle:
            json.dump(document, handle)
    assert bars.main([str(tmp_path / f"{i}.json.gz") for i in range(3)]) == 0
    out = capsys.readouterr().out
    assert "M <= 64: misses bar 1: 0, bar 2: 0, bar 3: 0" in out
    assert "beyond the bars: bar 1  7168x1536 M=96 residual glue" in out and "M > 64 (beyond the bars" in out
    # M = 64 is the last batch the bars hold for: a miss there fails the runs.
    for i in range(3):
        path = tmp_path / f"{i}.json.gz"
        with gzip.open(path, "rt") as handle:
            document = json.load(handle)
        document["cells"][-1]["batch"] = 64
        with gzip.open(path, "wt") as handle:
            json.dump(document, handle)
    assert bars.main([str(tmp_path / f"{i}.json.gz") for i in range(3)]) == 1
    assert "bar 1  7168x1536 M=64 residual glue" in capsys.readouterr().out


def test_compare_runs_sums_up_each_set_by_its_medians_and_lists_changed_tactics(tmp_path, capsys):
    compare = load_script("compare_runs")
    old, new = SplitKTactic(64, 8, 1, 6).to_dict(), SplitKTactic(128, 8, 1, 6).to_dict()

    def run(name, us, tactic, gpu="NVIDIA H100 80GB HBM3"):
        cells = [{**cell(7168, 768, 1, us, 6.0, context=context), "tactic": tactic} for context in ("chain", "glue")]
        cells.append({**cell(7168, 768, 128, 8.0, 8.0), "tactic": old})
        return write_bench(tmp_path / name, gpu, cells)

    before = [run("a1.json", 4.0, old), run("a2.json", 5.0, old), run("a3.json", 6.0, old)]
    after = [run("b1.json", 3.0, new), run("b2.json", 3.0, new)]
    compare.main(["--before", *before, "--after", *after])
    out = capsys.readouterr().out
    # Each set's median time (5.0 and 3.0 us) against torch.matmul's 6.0, per context and batch range.
    assert "chain    M=1-64: 1.2000x -> 2.0000x over 1 cells" in out
    assert "chain    M=96-256: 1.0000x -> 1.0000x over 1 cells" in out
    assert "7168x768 M=1   glue        5.00 ->    3.00 (-2.00)" in out
    assert "(64,8,1,6,1,1,1) -> (128,8,1,6,1,1,1)" in out
    assert "M=128" not in out.split("tactics\n")[1]  # its tactic did not change
    with pytest.raises(SystemExit):
        compare.main(["--before", *before, "--after", run("h200.json", 3.0, new, gpu="NVIDIA H200")])
    with pytest.raises(SystemExit):  # two GPUs within one set
        compare.main(["--before", *before, run("h200.json", 3.0, new, gpu="NVIDIA H200"), "--after", *after])
    with pytest.raises(SystemExit):  # no cells of that policy
        compare.main(["--before", *before, "--after", *after, "--policy", "heuristic"])
    with pytest.raises(SystemExit):  # a path that is not there
        compare.main(["--before", str(tmp_path / "missing.json"), "--after", *after])
    elsewhere = write_bench(tmp_path / "c1.json", "NVIDIA H100 80GB HBM3",
                            [{**cell(1536, 128, 1, 1.0, 2.0), "tactic": new}])
    with pytest.raises(SystemExit):  # no cell in common
        compare.main(["--before", *before, "--after", elsewhere])
    # A cell that only one set holds is named and left out of the sums.
    extra = write_bench(tmp_path / "b3.json", "NVIDIA H100 80GB HBM3",
                        [{**cell(7168, 1536, 1, 3.0, 6.0), "tactic": new}])
    capsys.readouterr()
    compare.main(["--before", *before, "--after", *after, extra])
    out = capsys.readouterr().out
    assert "1 cells in one set only, left out: 7168x1536 M=1 chain" in out
    assert "chain    M=1-64: 1.2000x -> 2.0000x over 1 cells" in out


def test_heuristic_regret_takes_each_cell_from_the_last_file_that_timed_it():
    regret = load_script("heuristic_regret")
    older = [{"n": 1, "k": 2, "batch": 1, "file": "old"}, {"n": 1, "k": 2, "batch": 8, "file": "old"}]
    newer = [{"n": 1, "k": 2, "batch": 8, "file": "new"}, {"n": 3, "k": 2, "batch": 1, "file": "new"}]
    def files(documents):
        return {(c["n"], c["k"], c["batch"]): c["file"] for c in regret.newest_cells(documents)}
    assert files([older, newer]) == {(1, 2, 1): "old", (1, 2, 8): "new", (3, 2, 1): "new"}
    assert files([newer, older])[1, 2, 8] == "old"  # the order given decides


def test_heuristic_regret_judges_the_mean_or_the_worst_context_against_the_tuners_choice():
    regret = load_script("heuristic_regret")
    pick = regret.default_tactic(7168, 1536, 1, H100)
    other = SplitKTactic(128, 8, 4, 6)
    # The pick: 10 us back to back, 12 after glue; the other 11 and 10 (the tuner's choice on the geometric mean).
    cell = {"n": 7168, "k": 1536, "batch": 1, "contexts": ["chain", "glue"],
            "timed": [[asdict(pick), 10.0, 12.0], [asdict(other), 11.0, 10.0]]}
    (*_, mean, _), = regret.regrets([cell], H100)
    (*_, worst, _), = regret.regrets([cell], H100, worst_context=True)
    assert mean == pytest.approx((120 ** 0.5) / (110 ** 0.5)) and worst == pytest.approx(1.2)
    (*_, untimed, _), = regret.regrets([{**cell, "timed": [[asdict(other), 11.0, 10.0]]}], H100, worst_context=True)
    assert untimed is None


def test_early_trigger_pairs_compare_each_twin_across_two_sets_of_timings(tmp_path, capsys):
    pairs = load_script("early_trigger_pairs")
    tactic = {"weight_rows": 64, "activation_rows": 8, "split": 1, "stages": 6, "k_boxes": 4, "multicast": 1,
              "column_groups": 1, "weight_as_b": False, "fold": 1}
    early, plain = {**tactic, "dependents_at_start": True}, {**tactic, "dependents_at_start": False}
    lone = {**tactic, "stages": 12, "dependents_at_start": True}  # no plain twin: not a pair

    def timings(path, batch_us):
        cells = [{"n": 8448, "k": 7168, "batch": batch, "contexts": ["chain", "glue"],
                  "timed": [[early, *e], [plain, *p], [lone, 1.0, 1.0]]} for batch, (e, p) in batch_us.items()]
        path.write_text(json.dumps(cells))
        return str(path)

    # Batch 1 and 8: E slower by 0.5 / 0.7 us back to back, plain faster by 0.9 / 0.7; after glue both 0.4 faster.
    # Batch 128 is past the streaming batches and ignored.
    before = timings(tmp_path / "before.json", {1: ((38.0, 41.0), (39.9, 41.0)), 8: ((38.0, 41.0), (39.9, 41.0)),
                                                 128: ((50.0, 50.0), (50.0, 50.0))})
    after = timings(tmp_path / "after.json", {1: ((38.5, 40.6), (39.0, 40.6)), 8: ((38.7, 40.6), (39.2, 40.6)),
                                               128: ((90.0, 90.0), (10.0, 10.0))})
    (count, shift), = pairs.shifts(pairs.twins([before]), pairs.twins([after])).values()
    assert count == 2
    assert shift["chain"] == pytest.approx((0.6, -0.8)) and shift["glue"] == pytest.approx((-0.4, -0.4))
    assert pairs.main(["--before", before, "--after", after]) == 0
    assert "8448x7168: 2 pairs   chain +0.60 / -0.80   glue -0.40 / -0.40" in capsys.readouterr().out
