"""GPU test of what users run: every tactic of the shipped tables, and the heuristic's pick for this GPU, at its own
shape and batch, on any Hopper GPU.

Runs with the tactic grid under pytest-xdist in scripts/gpu-check: most of its time is compiling.
"""

import pytest
import torch

from decode_projection import PreparedProjection
from decode_projection.measure.checks import assert_close_to_reference
from decode_projection.policy.policies import resolve_policies
from decode_projection.policy.workload import DECODE_BATCHES, KIMI_K3_SHAPES
from decode_projection.runtime.gpu import gpu_spec

from .guarded_output import run_guarded
from .shipped_tables import gpu_id, resolved_on, shipped_gpus

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["free", "batch-invariant"])
@pytest.mark.parametrize("shape", list(KIMI_K3_SHAPES), ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("gpu", shipped_gpus(), ids=gpu_id)
def test_every_shipped_tactic_on_its_own_cell(gpu, shape, batch_invariant):
    """Each shipped table's tactic at its own shape and batch, into a guarded output, against float64."""
    n, k = shape
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    policies, sources = resolved_on(gpu, n, k, DECODE_BATCHES, batch_invariant=batch_invariant)
    assert set(sources.values()) == {"table"}
    projection = PreparedProjection(weight, policies).prepare()
    for batch in DECODE_BATCHES:
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        out = run_guarded(projection, x, n, torch.bfloat16)
        assert_close_to_reference(out, x, weight, label=f"{n}x{k} M={batch} {projection.policies[batch]}")


@pytest.mark.parametrize("shape", list(KIMI_K3_SHAPES), ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_heuristic_pick_on_its_own_cell(shape):
    """The heuristic's tactic for this GPU (what a shape, batch or GPU without a table gets), against float64."""
    n, k = shape
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    policies, _ = resolve_policies(n, k, DECODE_BATCHES, gpu=gpu_spec(weight.device), weight_dtype=torch.bfloat16,
                                   output_dtype=torch.bfloat16, use_tables=False)
    projection = PreparedProjection(weight, policies).prepare()
    for batch in DECODE_BATCHES:
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        out = run_guarded(projection, x, n, torch.bfloat16)
        assert_close_to_reference(out, x, weight, label=f"{n}x{k} M={batch} {projection.policies[batch]}")
