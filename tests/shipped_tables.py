"""The shipped tables' tactics for GPU tests on whichever Hopper GPU is lent: every shipped tactic runs on any
of them, so an H100 checks the H200's tables too, and each table is resolved as on the GPU it was tuned for."""

from dataclasses import replace

import torch

from decode_projection.policy.policies import resolve_policies
from decode_projection.policy.tables import shipped_tables
from decode_projection.runtime.gpu import gpu_spec


def shipped_gpus() -> list[tuple[str, int]]:
    """``(GPU name, SM count)`` of every shipped table."""
    return sorted({(key.gpu, key.sm_count) for key in shipped_tables()})


def gpu_id(gpu) -> str:
    """A test id for a ``(GPU name, SM count)`` pair."""
    return f"{gpu[0]}-{gpu[1]}sm".replace(" ", "_")


def resolved_on(gpu, n, k, batches, *, batch_invariant):
    """``({batch: tactic}, {batch: "table" | "heuristic"})`` as ``for_weight`` resolves them on ``gpu``: its
    table, and the heuristic with this device's cluster residency elsewhere."""
    name, sm_count = gpu
    spec = replace(gpu_spec(torch.cuda.current_device()), name=name, sm_count=sm_count)
    return resolve_policies(n, k, batches, gpu=spec, weight_dtype=torch.bfloat16, output_dtype=torch.bfloat16,
                            batch_invariant=batch_invariant)
