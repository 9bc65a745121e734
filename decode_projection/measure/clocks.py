"""What the GPU ran at during a benchmark: SM clock, temperature and power, sampled by nvidia-smi.

Two H200 runs of the same tactics differed by 1-3% per cell on average
(docs/measuring.md), more than most tactic differences at small batches.
Clocks that drop under power or heat are the usual cause, so the benchmark
samples them in the background (nvidia-smi reads the driver, not the GPU's
work queue, so sampling does not disturb the timed kernels) and reports the
range next to its numbers. Without nvidia-smi the log stays empty.
"""

import statistics
import subprocess
import threading

FIELDS = ("clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw")


def sample(index: int) -> dict | None:
    """One reading of GPU ``index``: {field: float}, or None where nvidia-smi cannot say."""
    try:
        result = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True, text=True, timeout=10, check=True,
        )
        values = [float(part) for part in result.stdout.strip().split(",")]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return dict(zip(FIELDS, values)) if len(values) == len(FIELDS) else None


class ClockLog:
    """Samples GPU ``index`` every ``period_s`` while the ``with`` block runs; ``summary()`` after."""

    def __init__(self, index: int, period_s: float = 1.0):
        self.index, self.period_s = index, period_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            reading = sample(self.index)
            if reading is not None:
                self.samples.append(reading)
            if self._stop.wait(self.period_s):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """Sample count, SM clock min / median / max against the GPU's maximum, hottest and most power."""
        if not self.samples:
            return {"samples": 0}
        sm = [s["clocks.sm"] for s in self.samples]
        return {
            "samples": len(sm),
            "sm_mhz_min": min(sm), "sm_mhz_median": statistics.median(sm), "sm_mhz_max": max(sm),
            "sm_mhz_limit": max(s["clocks.max.sm"] for s in self.samples),
            "temperature_c_max": max(s["temperature.gpu"] for s in self.samples),
            "power_w_max": max(s["power.draw"] for s in self.samples),
        }


def describe(summary: dict | None) -> str:
    """One line for the benchmark's header."""
    if summary is None:
        return "GPU clocks: not recorded in this run"
    if not summary.get("samples"):
        return "GPU clocks: not sampled (nvidia-smi gave no reading)"
    return (f"GPU clocks over {summary['samples']} samples: SM {summary['sm_mhz_min']:.0f}-{summary['sm_mhz_max']:.0f} MHz "
            f"(median {summary['sm_mhz_median']:.0f}, limit {summary['sm_mhz_limit']:.0f}), "
            f"up to {summary['temperature_c_max']:.0f} C and {summary['power_w_max']:.0f} W")
