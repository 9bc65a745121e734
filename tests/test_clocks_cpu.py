"""The benchmark's clock log, with nvidia-smi stood in for."""

import subprocess
import time

from decode_projection.measure import clocks


def test_clock_log_summarizes_samples(monkeypatch):
    readings = iter(["1980, 1980, 40, 300\n", "1755, 1980, 55, 690\n", "1830, 1980, 52, 650\n"])

    def fake_run(command, **kwargs):
        assert command[0] == "nvidia-smi" and "-i" in command
        return subprocess.CompletedProcess(command, 0, stdout=next(readings, "1830, 1980, 52, 650\n"))

    monkeypatch.setattr(subprocess, "run", fake_run)
    with clocks.ClockLog(0, period_s=0.0) as log:
        deadline = time.monotonic() + 10
        while len(log.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
    summary = log.summary()
    assert summary["sm_mhz_min"] == 1755 and summary["sm_mhz_limit"] == 1980 and summary["power_w_max"] == 690
    assert "SM 1755-1980 MHz" in clocks.describe(summary)


def test_without_nvidia_smi_the_log_is_empty(monkeypatch):
    def missing(command, **kwargs):
        raise FileNotFoundError(command[0])

    monkeypatch.setattr(subprocess, "run", missing)
    with clocks.ClockLog(0, period_s=0.0) as log:
        pass
    assert log.summary() == {"samples": 0}
    assert "not sampled" in clocks.describe(log.summary()) and "not recorded" in clocks.describe(None)
