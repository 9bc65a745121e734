"""Time the decode glue ops next to the PyTorch ops they replace, alone and in front of the projection after them.

Rows, per width and padded batch:

- ``rms_norm``: ours (programmatic launch, and plain) next to ``F.rms_norm`` and the formula models write out;
- ``fused_add_rms_norm``: ours next to ``x + residual`` then ``F.rms_norm`` (two kernels);
- ``silu_and_mul``: ours next to ``F.silu(gate) * up``.

Alone, each op is timed as the benchmark times projections (``decode_projection.measure.timing``: CUDA-graph replay
of many launches, medians of rounds, providers replayed in turn); its inputs stay warm in L2, as they are in a
model, where the kernel before just wrote them. In front of a projection (``--pairs``, on by default) each op is
followed by the projection that follows it in a Kimi-K3 layer (the norm by fused_qkv_a 2112x7168, SiLU-and-mul
by the dense down 7168x4224), weights rotated cold; the time is of the pair. Ours lets the projection's weight
stream start while the glue still runs (it triggers its dependents as it starts); after PyTorch's ops the
projection is timed both with programmatic launch and plain. Every output of ours is checked against float64
(decode_projection.measure.ops_reference) before it is timed. Needs a Hopper GPU.

    python benchmarks/glue_ops.py
    python benchmarks/glue_ops.py --batches 1,8,64 --no-pairs --json glue.json
"""

import argparse
import json

import torch

from decode_projection.kernel import activation, norm
from decode_projection.measure.ops_reference import (
    GlueReference,
    rms_norm_float64,
    silu_and_mul_float64,
    torch_manual_rms_norm,
    torch_rms_norm,
    torch_silu_and_mul,
)
from decode_projection.measure.timing import cold_copies, interleaved_time_us
from decode_projection.projection import PreparedProjection

EPS = 1e-6
NORM_WIDTHS = (7168, 1536, 512)  # hidden, q latent, kv latent
SILU_WIDTHS = (4224, 1536)  # N of the dense and the shared MLP
# The projection after each op in a Kimi-K3 layer: (N, K).
FOLLOWING = {"rms_norm": (2112, 7168), "fused_add_rms_norm": (2112, 7168), "silu_and_mul": (7168, 4224)}


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def glue_launches(op, width, batch):
    """({provider: launch()}, the input of the projection after it for each provider) for one op."""
    if op == "silu_and_mul":
        x = randn(batch, 2 * width)
        out = torch.empty(batch, width, device="cuda", dtype=torch.bfloat16)
        GlueReference(silu_and_mul_float64(x), torch_silu_and_mul(x)).check(
            activation.silu_and_mul(x, out=out), f"silu_and_mul {batch}x{width}")
        return {
            "ours": lambda: activation.silu_and_mul(x, out=out),
            "ours/plain": lambda: activation.silu_and_mul(x, out=out, programmatic_launch=False),
            "F.silu(g)*u": lambda: torch_silu_and_mul(x),
        }
    x, weight = randn(batch, width), randn(width)
    out = torch.empty_like(x)
    if op == "rms_norm":
        GlueReference(rms_norm_float64(x, weight, EPS), torch_rms_norm(x, weight, EPS)).check(
            norm.rms_norm(x, weight, EPS, out=out), f"rms_norm {batch}x{width}")
        return {
            "ours": lambda: norm.rms_norm(x, weight, EPS, out=out),
            "ours/plain": lambda: norm.rms_norm(x, weight, EPS, out=out, programmatic_launch=False),
            "F.rms_norm": lambda: torch_rms_norm(x, weight, EPS),
            "manual": lambda: torch_manual_rms_norm(x, weight, EPS),
        }
    residual, total = randn(batch, width), torch.empty_like(x)
    norm.fused_add_rms_norm(x, residual, weight, EPS, out=out, residual_out=total)
    GlueReference(rms_norm_float64(total, weight, EPS), torch_rms_norm(total, weight, EPS)).check(
        out, f"fused_add_rms_norm {batch}x{width}")
    return {
        "ours": lambda: norm.fused_add_rms_norm(x, residual, weight, EPS, out=out, residual_out=total)[0],
        "ours/plain": lambda: norm.fused_add_rms_norm(x, residual, weight, EPS, out=out, residual_out=total,
                                                      programmatic_launch=False)[0],
        "x+r, F.rms_norm": lambda: torch_rms_norm(x + residual, weight, EPS),
    }


def time_alone(op, width, batch):
    """{provider: us per launch}, inputs warm in L2."""
    launches = glue_launches(op, width, batch)
    return interleaved_time_us({name: (lambda i, f=f: f()) for name, f in launches.items()}, 1)


def follows(op, width):
    """Whether the op's output of this width is the input of the projection after it (its K)."""
    return FOLLOWING[op][1] == width


def time_pairs(op, width, batch):
    """{provider -> projection: us per pair}, the projection's weights rotated cold."""
    n, k = FOLLOWING[op]
    launches = glue_launches(op, width, batch)
    copies = cold_copies(n * k * 2)
    weights = [randn(n, k) / k**0.5 for _ in range(copies)]
    projections = {flag: [PreparedProjection.for_weight(w, batches=(batch,), programmatic_launch=flag)
                          for w in weights] for flag in (True, False)}
    out = torch.empty(batch, n, device="cuda", dtype=torch.bfloat16)

    def pair(glue, programmatic):
        return lambda i: projections[programmatic][i].run(glue(), out)

    timed = {}
    for name, glue in launches.items():
        if name == "ours/plain":
            continue
        timed[f"{name} -> projection"] = pair(glue, True)
        if not name.startswith("ours"):
            timed[f"{name} -> projection/plain"] = pair(glue, False)
    return interleaved_time_us(timed, copies)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,4,16,64,256", help="padded batches, comma-separated")
    parser.add_argument("--no-pairs", action="store_true", help="time the ops alone only")
    parser.add_argument("--json", help="write every cell here")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    device = torch.cuda.get_device_name()
    print(f"{device}; microseconds per launch (CUDA-graph replay, medians); BF16")
    cells = []
    ops = [("rms_norm", w) for w in NORM_WIDTHS] + [("fused_add_rms_norm", w) for w in NORM_WIDTHS]
    ops += [("silu_and_mul", w) for w in SILU_WIDTHS]
    for op, width in ops:
        for batch in batches:
            timings = {"alone": time_alone(op, width, batch)}
            if not args.no_pairs and follows(op, width):
                timings["pair"] = time_pairs(op, width, batch)
            for context, times in timings.items():
                ours = times.get("ours") or times.get("ours -> projection")
                theirs = min(us for name, us in times.items() if not name.startswith("ours"))
                row = "  ".join(f"{name} {us:6.2f}" for name, us in times.items())
                print(f"{op:>18} {width:>5} M={batch:<3} {context:>5}: {row}   best PyTorch / ours {theirs / ours:.2f}x")
                cells.append({"op": op, "width": width, "batch": batch, "context": context, "us": times})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"gpu": device, "dtype": "bfloat16"}, "cells": cells}, f, indent=1)


if __name__ == "__main__":
    main()
