"""GPU tests for tactic choice: batch invariance, the one-line constructor, the tuner and the benchmark."""

import pytest
import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.measure.bench import run_benchmark
from decode_projection.measure.checks import assert_close_to_reference
from decode_projection.measure.report import format_tables
from decode_projection.policy.tables import load_table
from decode_projection.policy.workload import KIMI_K3_SHAPES
from decode_projection.runtime import architecture
from decode_projection.runtime.gpu import gpu_spec
from decode_projection.tuning.tune import tune
from decode_projection.warmup import compile_all

from .shipped_tables import gpu_id, resolved_on, shipped_gpus

pytestmark = pytest.mark.gpu


EVERY_BATCH = range(1, 257)


def invariant_policies(gpu, n, k) -> dict:
    """``{batch: tactic}`` at every batch as the batch-invariant table of ``gpu`` resolves them."""
    return resolved_on(gpu, n, k, EVERY_BATCH, batch_invariant=True)[0]


@pytest.fixture(scope="module")
def invariant_kernels():
    """The batch-invariant tables' kernels, compiled in parallel up front (one by one, compiling took most of
    the invariance tests' 200 s on the H200)."""
    arch = architecture(torch.device("cuda", torch.cuda.current_device()))
    compile_all({(tactic, torch.bfloat16, arch, torch.bfloat16)
                 for gpu in shipped_gpus() for n, k in KIMI_K3_SHAPES
                 for tactic in invariant_policies(gpu, n, k).values()}, progress=False)


@pytest.mark.usefixtures("invariant_kernels")
@pytest.mark.parametrize("shape", list(KIMI_K3_SHAPES), ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("gpu", shipped_gpus(), ids=gpu_id)
def test_batch_invariant_rows_do_not_depend_on_the_batch(gpu, shape):
    n, k = shape
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection(weight, invariant_policies(gpu, n, k)).prepare()
    assert len({t.summation_order for t in projection.policies.values()}) == 1
    alone = torch.empty(256, n, device="cuda", dtype=torch.bfloat16)
    for row in range(256):
        projection.run(x[row : row + 1], alone[row : row + 1])
    for batch in range(2, 257):
        together = projection.run(x[:batch], torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16))
        if not torch.equal(together, alone[:batch]):
            row, col = (together != alone[:batch]).nonzero()[0].tolist()
            raise AssertionError(f"{n}x{k}: out[{row}, {col}] at batch {batch} is {together[row, col]}, "
                                 f"at batch 1 {alone[row, col]} ({projection.policies[batch]})")
    assert_close_to_reference(alone, x, weight, label=f"{n}x{k} batch-invariant")


# Summation orders (split, K boxes), each with a whole-warpgroup tile first and weight-as-A tiles padded
# to whole warpgroups after it (one, two and three warpgroups, activation tiles of 8 to 64 rows), or tiles with
# K folded into as many segments as the split has ranks (the last segment partly past K).
ORDERS = [
    [SplitKTactic(64, 8, 1, 6, k_boxes=2), SplitKTactic(56, 8, 1, 6, k_boxes=2), SplitKTactic(56, 16, 1, 5, k_boxes=2),
     SplitKTactic(160, 32, 1, 4, k_boxes=2), SplitKTactic(56, 64, 1, 7, k_boxes=2)],
    [SplitKTactic(128, 8, 4, 6), SplitKTactic(120, 16, 4, 6), SplitKTactic(48, 64, 4, 7), SplitKTactic(176, 32, 4, 4)],
    [SplitKTactic(64, 8, 2, 6, k_boxes=4), SplitKTactic(28, 8, 1, 5, k_boxes=4, dependents_at_start=True, fold=2),
     SplitKTactic(17, 16, 1, 4, k_boxes=4, fold=2), SplitKTactic(32, 32, 1, 3, k_boxes=4, fold=2)],
    [SplitKTactic(128, 16, 4, 6, k_boxes=2), SplitKTactic(16, 8, 1, 9, k_boxes=2, fold=4),
     SplitKTactic(12, 32, 1, 4, k_boxes=2, fold=4)],
]


@pytest.mark.parametrize("tactics", ORDERS, ids=lambda ts: "split{}-boxes{}".format(*ts[0].summation_order))
def test_padded_and_folded_tiles_sum_in_the_order_of_whole_tiles(tactics):
    """A padded or folded weight tile gives every output bit for bit what the whole tile of its order gives,
    at any batch."""
    n, k, batch = 1000, 1544, 61  # ragged weight tiles, a K tail, a partial activation tile
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    whole = PreparedProjection(weight, {1: tactics[0]}).prepare()
    alone = torch.cat([whole.run(x[row : row + 1], torch.empty(1, n, device="cuda", dtype=torch.bfloat16))
                       for row in range(batch)])
    for tactic in tactics:
        assert tactic.summation_order == tactics[0].summation_order
        together = PreparedProjection(weight, {batch: tactic}).prepare().run(
            x, torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16))
        if not torch.equal(together, alone):
            row, col = (together != alone).nonzero()[0].tolist()
            raise AssertionError(f"{tactic}: out[{row}, {col}] is {together[row, col]}, "
                                 f"{tactics[0]} one row at a time gives {alone[row, col]}")
    assert_close_to_reference(alone, x, weight, label=f"{tactics[0]} one row at a time")


def test_for_weight_picks_table_or_heuristic_and_is_correct():
    weight = torch.randn(2112, 7168, device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection.for_weight(weight, batches=(1, 5, 64))
    spec = gpu_spec(weight.device)
    # A shipped table for this GPU holds 1 and 64, never 5; without one, every batch is the heuristic's.
    tuned = "table" if (spec.name, spec.sm_count) in shipped_gpus() else "heuristic"
    assert projection.policy_sources == {1: tuned, 5: "heuristic", 64: tuned}
    for batch in (1, 5, 64):
        x = torch.randn(batch, 7168, device="cuda", dtype=torch.bfloat16)
        out = projection.run(x, torch.full((batch, 2112), float("nan"), device="cuda", dtype=torch.bfloat16))
        assert_close_to_reference(out, x, weight, label=f"for_weight M={batch}")


def test_tuner_writes_loadable_tables(tmp_path):
    path, invariant_path = tmp_path / "table.json", tmp_path / "invariant.json"
    entries, invariant = tune([(1024, 1536)], [1, 16], limit=2, invariant_limit=2, out_path=path,
                              invariant_out_path=invariant_path, timings_path=tmp_path / "timings.json")
    assert sorted(e["batch"] for e in entries) == [1, 16] == sorted(e["batch"] for e in invariant)
    assert all(e["us"] > 0 for e in entries + invariant)
    assert len(load_table(path)) == 1
    (tactics,) = load_table(invariant_path).values()
    assert len({t.summation_order for t in tactics.values()}) == 1
    # The free table may only be faster: it saw every candidate the invariant one saw.
    free = {e["batch"]: e["us"] for e in entries}
    assert all(free[e["batch"]] <= e["us"] for e in invariant)


def test_benchmark_times_every_provider():
    cells = run_benchmark([(2304, 1536)], [1, 16], ["heuristic"], weight_dtype=torch.bfloat16,
                          output_dtype=torch.bfloat16, programmatic_launches=(True, False))
    assert sorted((c.context, c.policy, c.batch) for c in cells) == [
        (context, policy, batch) for context in sorted(["chain", "pdl-glue", "glue"])
        for policy in ("heuristic", "heuristic/plain") for batch in (1, 16)]
    for cell in cells:
        assert 0 < cell.ceiling_us and 0 < cell.us and 0 < cell.cublas_us
        # Nothing reads a weight faster than the read-only kernel by more than timing noise, in the same context,
        # where neither overlaps its predecessor: launched with programmatic dependent launch, our prologue overlaps
        # the kernel before it (itself back to back, or the PDL-aware glue), which the read-only kernel cannot.
        if cell.context == "glue" or cell.policy.endswith("/plain"):
            assert cell.us > 0.8 * cell.ceiling_us, cell
    assert "geometric-mean speedup" in format_tables(cells)
