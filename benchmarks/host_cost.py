"""Host time of one eager call: ``PreparedProjection.run`` next to ``F.linear``, and the glue ops (``rms_norm``,
``fused_add_rms_norm``, ``silu_and_mul``) next to the PyTorch ops they replace, per call, in microseconds.

A decode loop that is not captured in a CUDA graph pays each call's host time: argument checks, the policy
lookup and the launch, which here includes encoding the weight's TMA map (it is passed by value). To time the host
alone, each timed loop first queues a GPU sleep longer than the loop itself, so that no call waits on the GPU,
and issues fewer calls than the launch queue holds; the median of ``--rounds`` loops is reported. A loop that
outlasted its sleep is flagged: its time may include waiting. Outputs are checked against ``F.linear`` before
timing. Needs a Hopper GPU.

    python benchmarks/host_cost.py
    python benchmarks/host_cost.py --shape 7168x768 --batches 1,64 --glue-width 7168
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from decode_projection import fused_add_rms_norm, rms_norm, silu_and_mul
from decode_projection.projection import PreparedProjection

SLEEP_CYCLES = 200_000_000  # about 0.1 s of GPU clock: longer than any timed loop of --calls calls
QUEUE_SAFE_CALLS = 500  # under the launch queue's depth (about 1024 kernels), so issuing never blocks


def host_us_per_call(call, calls: int, rounds: int) -> tuple[float, bool]:
    """(median host us per call over ``rounds`` loops, whether every loop ended before the GPU's sleep did)."""
    call()
    torch.cuda.synchronize()
    times, covered = [], True
    for _ in range(rounds):
        asleep = torch.cuda.Event()
        torch.cuda._sleep(SLEEP_CYCLES)
        asleep.record()
        began = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - began) * 1e6 / calls)
        covered &= not asleep.query()  # the sleep still running: no call waited on the GPU
        torch.cuda.synchronize()
    return statistics.median(times), covered


def marked(us: float, covered: bool) -> str:
    """``us`` to two places, starred where a loop outlasted the GPU's sleep."""
    return f"{us:.2f}{'' if covered else '*'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", help="NxK (repeatable; default 1536x128 and 7168x768)")
    parser.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes")
    parser.add_argument("--calls", type=int, default=200, help=f"calls per timed loop (at most {QUEUE_SAFE_CALLS})")
    parser.add_argument("--rounds", type=int, default=7, help="timed loops; the median is reported")
    parser.add_argument("--glue-width", type=int, action="append",
                        help="hidden width of the glue ops' rows (repeatable; default 7168; 0: no glue ops)")
    args = parser.parse_args()
    if not 0 < args.calls <= QUEUE_SAFE_CALLS:
        parser.error(f"--calls must be 1..{QUEUE_SAFE_CALLS}: more would fill the launch queue and wait on the GPU")
    shapes = [tuple(int(v) for v in s.split("x")) for s in (args.shape or ["1536x128", "7168x768"])]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; host us per call, median of {args.rounds} "
          f"loops of {args.calls} calls ('*': a loop outlasted the GPU's sleep)")
    print(f"{'cell':<18} {'run()':>8} {'F.linear':>9}")
    for n, k in shapes:
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        projection = PreparedProjection.for_weight(weight, batches=batches)
        for m in batches:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            projection.run(x, out)
            torch.testing.assert_close(out, F.linear(x, weight), rtol=2e-2, atol=2e-2)
            ours, ours_covered = host_us_per_call(lambda: projection.run(x, out), args.calls, args.rounds)
            theirs, theirs_covered = host_us_per_call(lambda: F.linear(x, weight), args.calls, args.rounds)
            print(f"{f'{n}x{k} M={m}':<18} {marked(ours, ours_covered):>8} {marked(theirs, theirs_covered):>9}")
    widths = [w for w in (args.glue_width or [7168]) if w]
    if widths:
        print(f"{'glue op':<30} {'ours':>8} {'torch':>9}")
    for width in widths:
        for m in batches:
            for label, ours_call, torch_call in glue_calls(m, width):
                ours, ours_covered = host_us_per_call(ours_call, args.calls, args.rounds)
                theirs, theirs_covered = host_us_per_call(torch_call, args.calls, args.rounds)
                cell = f"{label} {m}x{width}"
                print(f"{cell:<30} {marked(ours, ours_covered):>8} {marked(theirs, theirs_covered):>9}")


def glue_calls(rows: int, width: int):
    """``[(label, our op, the PyTorch op it replaces)]`` on fresh ``rows`` x ``width`` BF16 operands, each of ours
    checked against its PyTorch op first; ours write into a given output, as a decode loop calls them."""
    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    normed, summed = torch.empty_like(x), torch.empty_like(x)
    gate_up = torch.randn(rows, 2 * width, device="cuda", dtype=torch.bfloat16)
    activated = torch.empty(rows, width, device="cuda", dtype=torch.bfloat16)
    calls = [
        ("rms_norm", lambda: rms_norm(x, weight, out=normed), lambda: F.rms_norm(x, (width,), weight, 1e-6)),
        # Two PyTorch ops (the add, then the norm) against one kernel; the output compared is the norm.
        ("fused_add_rms_norm", lambda: fused_add_rms_norm(x, residual, weight, out=normed, residual_out=summed)[0],
         lambda: F.rms_norm(x + residual, (width,), weight, 1e-6)),
        ("silu_and_mul", lambda: silu_and_mul(gate_up, out=activated),
         lambda: F.silu(gate_up[:, :width]) * gate_up[:, width:]),
    ]
    for _, ours, theirs in calls:
        torch.testing.assert_close(ours(), theirs(), rtol=2e-2, atol=2e-2)
    return calls


if __name__ == "__main__":
    main()
