"""CPU tests of the command line: the compile-only report and argument errors."""

import pytest
import torch

from decode_projection.__main__ import main
from decode_projection.kernel.tactic import SplitKTactic
from decode_projection.projection import compile_projection


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_bench_without_gpu_reports_compiled_kernels(no_gpu, capsys):
    assert main(["bench", "--shape", "2304x1536", "--batches", "1,64", "--policies", "heuristic"]) == 0
    out = capsys.readouterr().out
    assert "(128,8,3,6,2,1,1)" in out and "(64,64,2,7,2,1,1)" in out
    assert "Timing needs a Hopper GPU" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("(")]
    assert rows and all(int(row[4]) > 0 and int(row[5]) > 0 and row[6] == "0" for row in rows)
    # The pdl-glue context (one of the default three) needs the PDL-aware glue kernel: it compiles too.
    assert "The PDL-aware glue kernel of the pdl-glue context" in out and "registers, 0 spills" in out
    assert main(["bench", "--shape", "2304x1536", "--batches", "1", "--policies", "heuristic", "--context",
                 "chain,glue"]) == 0
    assert "PDL-aware glue" not in capsys.readouterr().out


def test_tune_without_gpu_says_so(no_gpu, capsys, tmp_path):
    assert main(["tune", "--shape", "2304x1536", "--out", str(tmp_path / "t.json")]) == 2
    assert "needs a Hopper GPU" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["bench", "--shape", "2304by1536"],
    ["bench", "--shape", "0x1536"],
    ["bench", "--shape", "8x12"],  # K % 8 != 0: no projection takes it
    ["bench", "--csv", "/no/such/directory/cells.csv"],  # refused before the run, not after it
    ["tune", "--out", "/no/such/directory/t.json"],
    ["tune", "--out", "missing-table.json", "--update"],
    ["bench", "--batches", "1,x"],
    ["bench", "--batches", "0"],
    ["bench", "--batches", "1,99999999999"],
    ["bench", "--policies", "fastest"],
    ["bench", "--launch", "pdl"],
    ["bench", "--context", "pdl"],
    ["bench", "--context", "chain,chain"],
    ["bench", "--isolated", "--context", "glue"],  # --isolated is --context glue: one of them
    ["tune", "--out", "t.json", "--context", "chain,isolated"],
    ["bench", "--dtype", "fp8"],
    ["tune", "--out", "t.json", "--update", "--batch-invariant-out", "i.json"],
    ["tune", "--out", "t.json", "--invariant-order", "3072x7168=2,1"],
    ["tune", "--out", "t.json", "--batch-invariant-out", "i.json", "--shape", "2112x7168",
     "--invariant-order", "3072x7168=2,1"],
    ["tune", "--out", "t.json", "--batch-invariant-out", "i.json", "--invariant-order", "3072x7168:2,1"],
    ["tune", "--out", "t.json", "--batch-invariant-out", "i.json", "--invariant-order", "3072x7168=2,3"],
    ["tune", "--out", "t.json", "--invariant-order", "shipped"],
    ["tune", "--out", "t.json", "--batch-invariant-out", "i.json", "--invariant-order", "shipped",
     "--invariant-order", "shipped"],
])
def test_bad_arguments_exit_with_usage(argv, no_gpu):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_tune_pins_the_shipped_orders_unless_one_is_given(monkeypatch, capsys, tmp_path):
    import decode_projection.__main__ as cli
    import decode_projection.runtime.gpu
    import decode_projection.tuning.tune
    from decode_projection.runtime.gpu import H200

    runs = []
    monkeypatch.setattr(cli, "hopper_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(decode_projection.runtime.gpu, "gpu_spec", lambda device: H200)
    monkeypatch.setattr(decode_projection.tuning.tune, "tune", lambda *args, **kwargs: runs.append(kwargs))
    shapes = ["--shape", "3584x7168", "--shape", "2304x1536", "--shape", "64x128"]  # the last in no table
    assert main(["tune", *shapes, "--out", str(tmp_path / "t.json"), "--batch-invariant-out", str(tmp_path / "i.json"),
                 "--invariant-order", "shipped", "--invariant-order", "2304x1536=1,1"]) == 0
    # 3584 x 7168 keeps the shipped table's split of 2 in 2-box stages; the order given for 2304 x 1536 wins.
    assert runs[0]["pinned_orders"] == {(3584, 7168): (2, 2), (2304, 1536): (1, 1)}
    assert "the shipped batch-invariant orders: 3584x7168=2,2, 2304x1536=3,1" in capsys.readouterr().out
    # Every candidate is scored in all three launch contexts unless told otherwise; a fresh tune does not resume.
    assert runs[0]["contexts"] == ["chain", "pdl-glue", "glue"] and runs[0]["resume"] is False
    assert main(["tune", "--shape", "2304x1536", "--out", str(tmp_path / "t.json"), "--context", "chain,glue",
                 "--resume"]) == 0
    assert runs[1]["contexts"] == ["chain", "glue"] and runs[1]["resume"] is True


def test_tune_resume_refuses_tables_that_are_not_tables(no_gpu, tmp_path, capsys):
    (tmp_path / "i.json").write_text("not json")
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--out", str(tmp_path / "t.json"), "--batch-invariant-out", str(tmp_path / "i.json"),
              "--resume"])
    assert exit_info.value.code == 2 and "--resume keeps the cells of --batch-invariant-out" in capsys.readouterr().err
    # Missing, they are a fresh start: the arguments pass (and tuning needs a GPU).
    assert main(["tune", "--out", str(tmp_path / "t.json"), "--resume"]) == 2
    assert "needs a Hopper GPU" in capsys.readouterr().err


def test_warm_fills_the_persistent_cache(no_gpu, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODE_PROJECTION_CACHE_DIR", str(tmp_path))
    compile_projection.cache_clear()  # kernels compiled by earlier tests must be written again
    assert main(["warm", "--shape", "1536x128", "--batches", "1,64", "--policies", "heuristic", "--workers", "1"]) == 0
    assert "2 kernels for sm_90a in " + str(tmp_path) in capsys.readouterr().out
    assert len(list(tmp_path.glob("*.o"))) == 2
    # The same kernels launched without programmatic dependent launch are two more files.
    assert main(["warm", "--shape", "1536x128", "--batches", "1,64", "--policies", "heuristic", "--workers", "1",
                 "--no-programmatic-launch"]) == 0
    assert len(list(tmp_path.glob("*.o"))) == 4


def test_warm_refuses_without_a_disk_cache_or_with_no_workers(no_gpu, capsys, monkeypatch):
    monkeypatch.setenv("DECODE_PROJECTION_DISK_CACHE", "0")
    assert main(["warm", "--shape", "1536x128", "--batches", "1"]) == 2
    assert "disk cache is off" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["warm", "--workers", "0"])


META = {"gpu": "NVIDIA H200", "sm_count": 132, "torch": "2.11", "cuda": "13.0", "cutlass_dsl": "4.8.1",
        "date": "2026-12-04", "method": "cold L2"}


def test_markdown_of_a_saved_run_has_a_table_per_policy_and_context(capsys, tmp_path):
    from decode_projection.measure.bench import Cell
    from decode_projection.measure.report import write_json

    tactic = SplitKTactic(64, 8, 1, 8)
    cells = [Cell(2304, 1536, 1, policy, "table", tactic, us + extra, 5.1 + extra, 3.4 + extra, context=context)
             for context, extra in (("chain", 0.0), ("glue", 2.0))
             for policy, us in (("tuned", 3.0), ("batch-invariant", 3.2))]
    write_json(tmp_path / "run.json", cells, META)
    assert main(["bench", "--from-json", str(tmp_path / "run.json"), "--markdown"]) == 0
    printed = capsys.readouterr().out
    for context in ("chain", "glue"):
        assert f"tuned, {context}:\n| N x K" in printed and f"batch-invariant, {context}:\n| N x K" in printed
    assert "| 2304 x 1536 | 7.1 | 3.4 | 3.0 / 5.1 |" in printed and "| 3.2 / 5.1 |" in printed
    assert "| 2304 x 1536 | 7.1 | 5.4 | 5.0 / 7.1 |" in printed and "| 5.2 / 7.1 |" in printed
    # A text table and a summary line per context and policy.
    assert "== chain: back to back" in printed and "== glue: after a plain PyTorch" in printed
    assert "chain tuned: geometric-mean speedup over torch.matmul 1.70x" in printed
    assert "glue tuned: geometric-mean speedup over torch.matmul 1.42x" in printed
    # The plot has a panel per shape and context.
    assert main(["bench", "--from-json", str(tmp_path / "run.json"), "--plot", str(tmp_path / "run.png")]) == 0
    assert (tmp_path / "run.png").read_bytes().startswith(b"\x89PNG")


def test_a_run_saved_before_cells_had_contexts_reads_as_the_context_it_was_timed_in(capsys, tmp_path):
    import json

    row = {"n": 2304, "k": 1536, "batch": 1, "policy": "tuned", "source": "table",
           "tactic": [64, 8, 1, 8, 1, 1, 1, False, False, 1], "us": 5.0, "cublas_us": 7.1, "ceiling_us": 5.4}
    for method, context in (("cold L2, back to back", "chain"),
                            ("cold L2, a small foreign kernel before every launch (subtracted)", "glue")):
        (tmp_path / "old.json").write_text(json.dumps({"meta": dict(META, method=method), "cells": [row]}))
        assert main(["bench", "--from-json", str(tmp_path / "old.json")]) == 0
        assert f"\n{context} tuned: geometric-mean speedup" in capsys.readouterr().out


def test_saved_runs_store_tactics_by_name_and_older_runs_still_read(tmp_path):
    import json

    from decode_projection.measure.bench import Cell
    from decode_projection.measure.report import load_json, write_json

    tactic = SplitKTactic(56, 8, 1, 6, k_boxes=4, dependents_at_start=True)
    meta = {"gpu": "NVIDIA H200"}
    write_json(tmp_path / "run.json", [Cell(7168, 1536, 1, "tuned", "table", tactic, 3.0, 5.1, 3.4)], meta)
    document = json.loads((tmp_path / "run.json").read_text())
    assert document["format"] == 2 and document["cells"][0]["tactic"] == tactic.to_dict()
    # A run saved before format 2: no format, each tactic a list of its fields in order.
    older = {"meta": meta, "cells": [{**document["cells"][0], "tactic": list(tactic.to_dict().values())}]}
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert load_json(tmp_path / "older.json") == load_json(tmp_path / "run.json")
    assert load_json(tmp_path / "run.json")[0][0].tactic == tactic
    for claimed in (3, True, 2.0):
        (tmp_path / "future.json").write_text(json.dumps({**document, "format": claimed}))
        with pytest.raises(ValueError, match="saved run format"):
            load_json(tmp_path / "future.json")


def test_an_unreadable_saved_run_is_an_error_not_a_traceback(capsys, tmp_path):
    assert main(["bench", "--from-json", str(tmp_path / "missing.json")]) == 2
    for name, text in [("empty", "{}"), ("no-cells", '{"meta": {}, "cells": []}'), ("numbers", '{"cells": [1]}'),
                       ("list", "[1]"), ("unknown-cell", '{"meta": {}, "cells": [{"n": 1}]}')]:
        (tmp_path / f"{name}.json").write_text(text)
        assert main(["bench", "--from-json", str(tmp_path / f"{name}.json"), "--csv", str(tmp_path / "c.csv")]) == 2
        assert "cannot read a saved run" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["not json", "[1]", '{"format": 1}', '{"format": 1, "entries": {}}',
                                  '{"format": 1, "entries": [1]}', '{"format": 1, "entries": [{"n": 1}]}'])
def test_tune_update_refuses_an_out_that_is_not_a_table(text, no_gpu, tmp_path, capsys):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--out", str(tmp_path / "t.json"), "--update"])
    assert exit_info.value.code == 2 and "which is not a table" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--csv", "--json", "--plot"])
def test_an_output_path_that_is_a_directory_is_refused_before_the_run(option, no_gpu, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--shape", "2304x1536", option, str(tmp_path)])
    assert exit_info.value.code == 2 and "is a directory" in capsys.readouterr().err


def test_bench_without_gpu_says_its_output_files_were_not_written(no_gpu, capsys, tmp_path):
    assert main(["bench", "--shape", "2304x1536", "--batches", "1", "--json", str(tmp_path / "run.json")]) == 0
    assert "nothing written for --json" in capsys.readouterr().out and not (tmp_path / "run.json").exists()


def test_the_epilogue_benchmark_needs_a_gpu_and_known_epilogues(no_gpu, capsys):
    assert main(["bench", "--epilogue", "residual,bias"]) == 2
    assert "needs a Hopper GPU" in capsys.readouterr().err
    for bad in ("silu", "bias,bias", ""):
        with pytest.raises(SystemExit):
            main(["bench", "--epilogue", bad])


def test_epilogue_cells_say_what_fusing_costs_and_saves():
    from decode_projection.measure.epilogue_bench import EpilogueCell, epilogue_table

    cells = [EpilogueCell(7168, 1536, 1, "residual", "chain", 6.0, 6.2, 9.0, 7.5),
             EpilogueCell(7168, 1536, 1, "bias", "glue", 8.0, 8.1, 10.5, None)]
    assert abs(cells[0].fused_extra_us - 0.2) < 1e-9 and abs(cells[0].speedup - 9.0 / 6.2) < 1e-9
    table = epilogue_table(cells)
    assert "7168 x 1536, residual (us)" in table and "7168 x 1536, bias (us)" in table
    assert "    1     chain    6.00    6.20   0.20      9.00    7.50           1.45x" in table
    assert "    1      glue    8.00    8.10   0.10     10.50       -           1.30x" in table
