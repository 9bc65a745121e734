"""CPU tests of the command line: the compile-only report and argument errors."""

import pytest
import torch

from decode_projection.__main__ import main
from decode_projection.projection import compile_projection


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_bench_without_gpu_reports_compiled_kernels(no_gpu, capsys):
    assert main(["bench", "--shape", "2304x1536", "--batches", "1,64", "--policies", "heuristic"]) == 0
    out = capsys.readouterr().out
    assert "(128,8,4,13,1,1,1)" in out and "(128,64,4,9,1,1,1)" in out
    assert "Timing needs a Hopper GPU" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("(")]
    assert rows and all(int(row[4]) > 0 and int(row[5]) > 0 and row[6] == "0" for row in rows)


def test_tune_without_gpu_says_so(no_gpu, capsys, tmp_path):
    assert main(["tune", "--shape", "2304x1536", "--out", str(tmp_path / "t.json")]) == 2
    assert "needs a Hopper GPU" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["bench", "--shape", "2304by1536"],
    ["bench", "--shape", "0x1536"],
    ["bench", "--batches", "1,x"],
    ["bench", "--batches", "0"],
    ["bench", "--policies", "fastest"],
    ["bench", "--launch", "pdl"],
    ["bench", "--dtype", "fp8"],
    ["tune", "--out", "t.json", "--update", "--batch-invariant-out", "i.json"],
])
def test_bad_arguments_exit_with_usage(argv, no_gpu):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


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
