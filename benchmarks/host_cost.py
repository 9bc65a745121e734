"""Host time of one eager call: ``PreparedProjection.run`` next to ``F.linear``, per call, in microseconds.

A decode loop that is not captured in a CUDA graph pays each call's host time: argument checks, the policy
lookup and the launch, which here includes encoding the weight's TMA map (it is passed by value). The shapes are
small enough that the GPU keeps up with the host, so the time per call in a loop of back-to-back calls is the
host's: the loop runs ``--calls`` calls, synchronises once, and the median of ``--rounds`` such loops is
reported, with the GPU time of one call (CUDA events over the same loop) beside it to show the loop was not
waiting on the GPU. Needs a Hopper GPU.

    python benchmarks/host_cost.py
    python benchmarks/host_cost.py --shape 7168x768 --batches 1,64
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from decode_projection.projection import PreparedProjection


def per_call_us(call, calls: int, rounds: int) -> tuple:
    """(host us per call, GPU us per call): medians over rounds of ``calls`` back-to-back calls."""
    for _ in range(calls // 10):
        call()
    torch.cuda.synchronize()
    host, device = [], []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        began = time.perf_counter()
        start.record()
        for _ in range(calls):
            call()
        end.record()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        host.append((issued - began) * 1e6 / calls)
        device.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(host), statistics.median(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", help="NxK (repeatable; default 1536x128 and 7168x768)")
    parser.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--rounds", type=int, default=5, help="timed loops; the median is reported")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in (args.shape or ["1536x128", "7168x768"])]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; us per call: host (GPU)")
    print(f"{'cell':<18} {'run()':>16} {'F.linear':>16}")
    for n, k in shapes:
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        projection = PreparedProjection.for_weight(weight, batches=batches)
        for m in batches:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ours = per_call_us(lambda: projection.run(x, out), args.calls, args.rounds)
            theirs = per_call_us(lambda: F.linear(x, weight), args.calls, args.rounds)
            torch.testing.assert_close(out, F.linear(x, weight), rtol=2e-2, atol=2e-2)
            cell = f"{n}x{k} M={m}"
            print(f"{cell:<18} {ours[0]:8.2f} ({ours[1]:5.2f}) {theirs[0]:8.2f} ({theirs[1]:5.2f})")


if __name__ == "__main__":
    main()
