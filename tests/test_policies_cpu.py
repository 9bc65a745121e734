"""CPU tests: the heuristic's picks (pinned), the tuner's candidates, and tuned tables as data."""

import json
import math
import os
import threading
from dataclasses import replace

import pytest
import torch

from decode_projection.kernel.tactic import SplitKTactic, gated_problems, max_stages
from decode_projection.policy import policies, tables
from decode_projection.policy.policies import (
    COMPUTE_BOUND_ROWS, LOADED_LATENCY_US, MIN_FILLING_ROWS, STREAMING_STAGE_BYTES, activation_rows_for,
    activation_tile_choices, covering_rows, covering_tile_grid, default_tactic, filling_tactic, folded_tactic,
    grid_ctas, more_sms_as_b_tactic, one_wave_tactic, predicted_time_us, resolve_policies, shared_weight_tactic,
    split_rule_tactic, unsplit_k_tactic, waves, weight_bytes_in_flight,
)
from decode_projection.policy.workload import DECODE_BATCHES, KIMI_K3_SHAPES
from decode_projection.runtime.gpu import H100, H200, KNOWN_GPUS, GpuSpec, device_index
from decode_projection.tuning import candidates
from decode_projection.tuning.candidates import (
    candidate_tactics, early_dependents_tactics, filling_tactics, with_k_boxes,
)

def early_start(*fields, **named) -> SplitKTactic:
    """A tactic that lets the next launch in as it starts."""
    return SplitKTactic(*fields, dependents_at_start=True, **named)


# The heuristic's H200 choices at batches 1, 16, 64 and 256: one tile per SM where N / SMs rounds to 32-192 rows,
# folded into one warpgroup tile at batches up to 16 where N / SMs is 12-32 rows, else split K (3 where that grid
# keeps within half the SMs; 64-row tiles from 48 activation rows on), stages of up to 40 KB, letting the next launch in as it starts (so do unsplit tiles
# alone on an SM); at 256 two
# 128-row activation tiles sharing each weight tile where N / 66 rounds to 48-256 rows, else the fullest grid that
# fits in one wave, or where that tiles the batch one over the whole batch that fills 70% of the SMs (its 64-row tiles
# in two column groups), else one weight-as-B tile per SM; where K is under a pipeline's worth, unsplit streaming
# tiles in the fewest CTAs that reach a third of the SMs, letting the next launch in early.
PINNED = [
    ((2112, 7168), early_start(16, 8, 1, 4, k_boxes=4, fold=4), SplitKTactic(128, 16, 3, 6, k_boxes=2),
     SplitKTactic(64, 64, 2, 7, k_boxes=2), SplitKTactic(64, 256, 3, 5, column_groups=2)),
    ((2304, 1536), SplitKTactic(128, 8, 3, 6, k_boxes=2), SplitKTactic(128, 16, 3, 6, k_boxes=2),
     SplitKTactic(64, 64, 2, 7, k_boxes=2), SplitKTactic(48, 128, 1, 10, multicast=2, weight_as_b=True)),
    ((7168, 1536), early_start(56, 8, 1, 6, k_boxes=4), early_start(56, 16, 1, 5, k_boxes=4),
     early_start(56, 64, 1, 7, k_boxes=2), SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True)),
    ((1536, 7168), early_start(12, 8, 1, 4, k_boxes=4, fold=4), SplitKTactic(128, 16, 8, 6, k_boxes=2),
     SplitKTactic(64, 64, 4, 7, k_boxes=2), SplitKTactic(64, 256, 4, 5, column_groups=2)),
    ((3072, 7168), early_start(24, 8, 1, 5, k_boxes=4, fold=2), early_start(24, 16, 1, 9, k_boxes=2, fold=2),
     SplitKTactic(64, 64, 2, 7, k_boxes=2), SplitKTactic(48, 128, 1, 10, multicast=2, weight_as_b=True)),
    ((7168, 768), early_start(56, 8, 1, 6, k_boxes=4), early_start(56, 16, 1, 5, k_boxes=4),
     early_start(56, 64, 1, 7, k_boxes=2), SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True)),
    ((6288, 7168), early_start(48, 8, 1, 6, k_boxes=4), early_start(48, 16, 1, 5, k_boxes=4),
     early_start(48, 64, 1, 7, k_boxes=2), SplitKTactic(96, 128, 1, 8, multicast=2, weight_as_b=True)),
    ((3584, 7168), early_start(28, 8, 1, 5, k_boxes=4, fold=2), early_start(28, 16, 1, 9, k_boxes=2, fold=2),
     early_start(32, 64, 1, 7, k_boxes=2), SplitKTactic(64, 128, 1, 9, multicast=2, weight_as_b=True)),
    ((7168, 3584), early_start(56, 8, 1, 6, k_boxes=4), early_start(56, 16, 1, 5, k_boxes=4),
     early_start(56, 64, 1, 7, k_boxes=2), SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True)),
    ((8448, 7168), early_start(64, 8, 1, 6, k_boxes=4), early_start(64, 16, 1, 5, k_boxes=4),
     early_start(64, 64, 1, 7, k_boxes=2), SplitKTactic(128, 128, 1, 7, multicast=2, weight_as_b=True)),
    ((7168, 4224), early_start(56, 8, 1, 6, k_boxes=4), early_start(56, 16, 1, 5, k_boxes=4),
     early_start(56, 64, 1, 7, k_boxes=2), SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True)),
    ((20480, 7168), early_start(160, 8, 1, 9), early_start(160, 16, 1, 8), early_start(160, 64, 1, 7),
     SplitKTactic(160, 256, 1, 4, weight_as_b=True)),
    ((7168, 14336), early_start(56, 8, 1, 6, k_boxes=4), early_start(56, 16, 1, 5, k_boxes=4),
     early_start(56, 64, 1, 7, k_boxes=2), SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True)),
    ((1536, 128), early_start(64, 8, 1, 25), early_start(64, 16, 1, 22), early_start(64, 64, 1, 14),
     early_start(128, 64, 1, 9)),
    ((3072, 128), early_start(64, 8, 1, 25), early_start(64, 16, 1, 22), early_start(64, 64, 1, 14),
     early_start(128, 64, 1, 9)),
]


@pytest.mark.parametrize("shape,at1,at16,at64,at256", PINNED, ids=[f"{n}x{k}" for (n, k), *_ in PINNED])
def test_heuristic_picks_are_pinned(shape, at1, at16, at64, at256):
    n, k = shape
    picks = {b: default_tactic(n, k, b) for b in (1, 16, 64, 256)}
    assert picks == {1: at1, 16: at16, 64: at64, 256: at256}


def test_filling_tiles_put_one_unsplit_tile_on_each_sm():
    for n in range(64, 30000, 136):
        for batch in (1, 16, 32, 64):
            tactic = filling_tactic(n, 7168, batch)
            rows = math.ceil(n / H200.sm_count)
            if 8 * math.ceil(rows / 8) < 32 and tactic is not None:  # a short tile: the next test's rule
                assert batch >= 32 and tactic.weight_rows >= 16 and weight_bytes_in_flight(
                    tactic, n, 7168, batch) >= H200.hbm_bytes_per_us * LOADED_LATENCY_US, n
            elif 8 * math.ceil(rows / 8) < 32 or rows > 192:  # under half a warpgroup tile, or wider than a tile
                assert tactic is None, n
                continue
            assert (tactic.split, tactic.weight_rows % 8, tactic.activation_rows) == (1, 0, activation_rows_for(batch))
            assert rows <= tactic.weight_rows < rows + 8 and grid_ctas(tactic, n, batch) <= H200.sm_count
            assert tactic.stage_bytes <= STREAMING_STAGE_BYTES or tactic.k_boxes == 1
            pick = folded_tactic(n, 7168, batch) or tactic  # tiles of at most 32 rows may fold K instead
            assert default_tactic(n, 7168, batch) == replace(pick, dependents_at_start=True)  # alone on its SM
            assert default_tactic(n, 7168, batch, batch_invariant=True).weight_rows in (64, 128)  # keeps its rule
    # Stages hold at most a third of K: 512 columns take 2 boxes a stage, not 4.
    assert filling_tactic(7168, 512, 1).k_boxes == 2 and filling_tactic(7168, 768, 1).k_boxes == 4


def test_folded_tiles_fill_the_sms_where_a_tile_has_at_most_32_rows():
    for n in range(64, 30000, 136):
        rows = math.ceil(n / H200.sm_count)
        for batch in (1, 8, 16, 24, 64, 128):
            tactic = folded_tactic(n, 7168, batch)
            acts = activation_rows_for(batch)
            # The most segments that keep 48 of the warpgroup tile's 64 rows weight and at most 32 activation rows.
            folds = [f for f in (4, 2) if f * rows <= 64 and f * rows >= 48 and f * acts <= 32]
            if not folds:
                assert tactic is None, (n, batch)
                continue
            assert (tactic.weight_rows, tactic.activation_rows, tactic.split, tactic.fold) == (rows, acts, 1, folds[0])
            assert tactic.valid and grid_ctas(tactic, n, batch) <= H200.sm_count and tactic.stages >= 3
            assert tactic.k_boxes == (4 if acts == 8 else 2)  # 4-box stages only at the smallest activation tile
            assert default_tactic(n, 7168, batch) == replace(tactic, dependents_at_start=True)  # alone on its SM
            assert default_tactic(n, 7168, batch, batch_invariant=True).fold == 1  # keeps batch 1's split
    # 2304 rows (18 a tile) fill 36 of 64 rows at a 2-fold: the split rule; 2112 rows at M=16 (16 of a 2-fold's 32).
    assert folded_tactic(2304, 1536, 1) is None and folded_tactic(2112, 7168, 16) is None


def test_pairs_of_activation_tiles_share_each_weight_tile_past_batch_192():
    pairs = H200.clusters_at_once(2)
    for n in range(64, 30000, 136):
        tactic = shared_weight_tactic(n, 7168, 256)
        rows = math.ceil(n / pairs)
        if rows <= 32 or rows > 256:
            assert tactic is None, n
            continue
        assert (tactic.weight_as_b, tactic.activation_rows, tactic.multicast, tactic.split) == (True, 128, 2, 1)
        assert rows <= tactic.weight_rows < rows + 16 and tactic.weight_rows % 16 == 0  # each CTA loads half
        assert waves(tactic, n, 256) == 1 and tactic == default_tactic(n, 7168, 256)
        assert shared_weight_tactic(n, 7168, 200) == tactic and shared_weight_tactic(n, 7168, 192) is None
        assert shared_weight_tactic(n, 7168, 300) is None  # three activation tiles: two pairs, a second wave


def test_a_grid_over_the_whole_batch_comes_first_where_it_fills_most_sms_and_k_is_long():
    # 33 tiles of 64 rows, split 3: 99 CTAs over one activation tile, where the fullest grids tile the batch.
    for batch in (96, 128, 192, 256):
        pick = one_wave_tactic(2112, 7168, batch)
        assert (pick.weight_rows, pick.split, pick.k_boxes) == (64, 3, 1)
        assert pick.activation_rows >= batch and grid_ctas(pick, 2112, batch) == 99
        assert with_k_boxes(pick, 2) in candidate_tactics(2112, 7168, batch, limit=12)  # its wide twin is timed too
    assert covering_tile_grid(2112, 7168, 300) is None  # no activation tile covers 300 rows
    assert covering_tile_grid(2304, 1536, 128) is None  # split 3 would leave each rank 8 K tiles
    assert one_wave_tactic(2304, 1536, 128).split == 2
    # Where the fullest grid already covers the batch it stays, with its own split, sharing and wide stages.
    assert covering_tile_grid(7168, 3584, 96) is not None and one_wave_tactic(7168, 3584, 96).k_boxes == 2
    assert covering_tile_grid(2304, 7168, 128).split == 3 and one_wave_tactic(2304, 7168, 128).split == 2
    assert one_wave_tactic(6288, 1536, 96).weight_rows == 128  # the K-tile floor leaves the covering grid split 1


def test_one_wave_tiles_share_activation_loads_where_the_waves_stay():
    shared = one_wave_tactic(7168, 3584, 256)
    assert shared.multicast == 4 and waves(shared, 7168, 256) == waves(replace(shared, multicast=1), 7168, 256)
    assert one_wave_tactic(2112, 7168, 256).multicast == 1  # 33 weight tiles: groups of 2 or 4 need a second wave
    assert one_wave_tactic(1536, 7168, 256).split == 4 and one_wave_tactic(1536, 7168, 256).multicast == 1


def test_one_wave_tiles_share_no_loads_where_k_is_under_a_pipelines_worth():
    # 128 columns are 2 K tiles: a shared activation load saves less than the cluster costs.
    for batch in (96, 128, 192):
        assert one_wave_tactic(1536, 128, batch).multicast == 1
        assert one_wave_tactic(1536, 128 * policies.MIN_K_TILES_PER_CTA, batch).multicast > 1


def test_a_weight_too_tall_for_a_one_wave_grid_gets_one_weight_as_b_tile_per_sm():
    # 20480 rows: 160 tiles of 128 rows, more than the SMs; 128 tiles of 160 rows as B fit, the batch in one tile.
    for batch, acts in ((96, 128), (128, 128), (192, 192), (256, 256)):
        tactic = one_wave_tactic(20480, 7168, batch)
        assert (tactic.weight_rows, tactic.activation_rows, tactic.split, tactic.weight_as_b) == (160, acts, 1, True)
        assert waves(tactic, 20480, batch) == 1 and grid_ctas(tactic, 20480, batch) == 128
    # Two activation tiles would take a second wave: the fewest CTAs of 128-row tiles, as before.
    assert not one_wave_tactic(20480, 7168, 300).weight_as_b


def test_streaming_picks_alone_on_an_sm_let_the_next_launch_in_as_they_start():
    for (n, k) in KIMI_K3_SHAPES:
        for batch in DECODE_BATCHES:
            for invariant in (False, True):
                tactic = default_tactic(n, k, batch, batch_invariant=invariant)
                streaming = activation_rows_for(batch) < COMPUTE_BOUND_ROWS
                # Compute-bound batches of a short K take streaming activation tiles (policies.short_k_tactic).
                short_k = not invariant and policies.short_k_tactic(n, k, batch) is not None
                may = policies.may_start_dependents_early(replace(tactic, dependents_at_start=False))
                assert tactic.dependents_at_start == ((streaming or short_k) and may), (n, k, batch)
                if tactic.dependents_at_start:
                    assert tactic.split == tactic.multicast == policies.ctas_per_sm(tactic) == 1
    # The early start leaves the order K is summed in as it was.
    assert default_tactic(7168, 1536, 8, batch_invariant=True).summation_order == \
        default_tactic(7168, 1536, 1, batch_invariant=True).summation_order


def test_pins_cover_the_workload():
    assert [shape for shape, *_ in PINNED] == list(KIMI_K3_SHAPES)


@pytest.mark.parametrize("shape", list(KIMI_K3_SHAPES))
def test_every_pick_is_valid_and_covers_its_batch(shape):
    for batch in DECODE_BATCHES + (5, 200, 300):
        tactic = default_tactic(*shape, batch)
        assert tactic.valid
        if activation_rows_for(batch) < COMPUTE_BOUND_ROWS:
            assert tactic.activation_rows >= batch
        else:  # compute-bound batches may tile the activations to fill one wave
            ctas = math.ceil(shape[0] / tactic.weight_rows) * tactic.split * math.ceil(batch / tactic.activation_rows)
            if tactic.weight_as_b and tactic.multicast == 1:  # one tile per SM where no grid fits one wave
                assert tactic.activation_rows >= batch and ctas <= H200.sm_count
                continue
            assert tactic.activation_rows in activation_tile_choices(batch)
            smallest_grid = tactic.weight_rows == 128 and tactic.split == 1  # when nothing fits one wave
            assert ctas <= H200.sm_count or smallest_grid


@pytest.mark.parametrize("shape", list(KIMI_K3_SHAPES))
def test_batch_invariant_heuristic_keeps_one_split(shape):
    picks = {b: default_tactic(*shape, b, batch_invariant=True) for b in range(1, 257)}
    assert len({t.summation_order for t in picks.values()}) == 1  # split and K boxes
    assert len({t.weight_rows for t in picks.values()}) == 1


def test_candidates_start_with_the_pick_and_are_valid():
    for (n, k) in KIMI_K3_SHAPES:
        for batch in (1, 32, 256):
            found = candidate_tactics(n, k, batch, limit=5)
            # A pick that lets the next launch in early is listed late and timed as its early twin.
            assert found[0] == replace(default_tactic(n, k, batch), dependents_at_start=False)
            assert default_tactic(n, k, batch) in found + early_dependents_tactics(found)
            assert len(found) == len(set(found)) and 1 <= len(found) <= 5
            assert all(t.valid for t in found)
            pinned = candidate_tactics(n, k, batch, limit=4, order=(2, 1))
            assert {t.summation_order for t in pinned} == {(2, 1)}


def test_gated_candidates_can_gate_and_give_16_row_tiles_two_to_an_sm():
    # The shared expert's gate/up pair, interleaved: 3072 x 7168. Its table's 24-row folded tiles cannot gate; the
    # 32-row ones folded as they are can.
    n, k = 3072, 7168
    for batch in (1, 8, 32, 64):
        found = policies.gated_candidates(n, k, batch, H100)
        assert found and all(t.valid and not gated_problems(t) and t.stages >= policies.MIN_STAGES for t in found)
        # Split in two over 16 activation rows or more (a gate pair and its up pair per reduction vector), in one
        # wave: 3072 rows in 48-row tiles (what gated_tactic makes of the table's 24-row ones) among them.
        split = [t for t in found if t.split > 1]
        assert all(t.split == 2 and t.fold == 1 and policies.waves(t, n, batch, H100) == 1 for t in split)
        assert all(t.activation_rows == max(activation_rows_for(batch), policies.GATED_SPLIT_ACTIVATION_ROWS)
                   for t in split)
        assert SplitKTactic(48, max(16, activation_rows_for(batch)), 2, 11, k_boxes=2) in split or batch > 8
        assert len({t.label for t in found}) == len(found)  # once each, so the order below is a total one
        times = [predicted_time_us(n, k, batch, t, H100) for t in found]
        assert times == sorted(times)
        assert policies.gated_candidates(n, k, batch, H100) == found
        found = [t for t in found if t.split == 1]
        assert all(t.activation_rows == activation_rows_for(batch) for t in found)
        # 192 CTAs of 16 rows run in one wave only two to an SM: the deepest pipeline that allows it is offered.
        sharing = [t for t in found if t.weight_rows == 16 and policies.ctas_per_sm(t, H100) == 2]
        assert {1, 2} <= {t.k_boxes for t in sharing}
        assert all(policies.waves(t, n, batch, H100, per_sm=2) == 1 for t in sharing)
        assert all(policies.ctas_per_sm(replace(t, stages=t.stages + 1), H100) == 1 for t in sharing)
        # Folded tiles too, each folded K segment two stages deep or more.
        folded = [t for t in found if t.fold > 1]
        assert {(32, 2), (16, 2), (16, 4)} <= {(t.weight_rows, t.fold) for t in folded}
        assert all(t.k_slice(k, rank=0).stages >= 2 for t in folded)
        # The deepest pipeline of every tile, and its early twin where it may let the next launch in early.
        deepest = [t for t in found if t.stages == max_stages(t.weight_rows, t.activation_rows, 1, t.k_boxes)]
        assert {t.weight_rows for t in deepest} == {rows for rows in range(16, 193, 16)}
        assert all(replace(t, dependents_at_start=True) in found
                   for t in deepest if policies.may_start_dependents_early(t, H100))
        # 64 tiles of 48 rows have an SM each anyway: no shallower twin.
        assert {t.stages for t in found if t.weight_rows == 48 and t.k_boxes == 1} == {
            max_stages(48, activation_rows_for(batch), 1)}


def test_cost_model_prefers_in_flight_bytes():
    shallow = SplitKTactic(128, 8, 1, 2)
    deep = SplitKTactic(128, 8, 1, 13)
    assert predicted_time_us(6288, 7168, 1, deep) < predicted_time_us(6288, 7168, 1, shallow)
    floor = 6288 * 7168 * 2 / H200.hbm_bytes_per_us
    assert predicted_time_us(6288, 7168, 1, deep) > floor


def entry(batch, tactic, *, n=2112, k=7168, invariant=False, gpu="NVIDIA H200"):
    return {"gpu": gpu, "sm_count": 132, "n": n, "k": k, "weight_dtype": "bfloat16",
            "output_dtype": "bfloat16", "batch_invariant": invariant, "batch": batch,
            "tactic": tactic.to_dict(), "us": 9.0}


def test_table_round_trip_and_lookup(tmp_path, monkeypatch):
    path = tmp_path / "h200.json"
    tables.write_table(path, [entry(1, SplitKTactic(64, 8, 2, 25)), entry(8, SplitKTactic(64, 8, 2, 25)),
                              entry(1, SplitKTactic(128, 8, 4, 13), gpu="NVIDIA H100")],
                       dsl_version="4.8.1", measured="2026-12-02")
    loaded = tables.load_table(path)
    key = tables.TableKey.for_cell(H200, 2112, 7168, weight_dtype=torch.bfloat16, output_dtype=torch.bfloat16,
                                   batch_invariant=False)
    assert key == tables.key_of(entry(1, SplitKTactic(64, 8, 2, 25)))
    assert tables.table_policies(key, [1, 8, 16], loaded) == {1: SplitKTactic(64, 8, 2, 25), 8: SplitKTactic(64, 8, 2, 25)}
    monkeypatch.setattr(tables, "shipped_tables", lambda: loaded)
    found, sources = resolve_policies(2112, 7168, [1, 16], gpu=H200, weight_dtype=torch.bfloat16,
                                      output_dtype=torch.bfloat16)
    assert found[1] == SplitKTactic(64, 8, 2, 25) and sources == {1: "table", 16: "heuristic"}
    assert found[16] == default_tactic(2112, 7168, 16)
    # Another GPU (one with no shipped table), dtype or shape never borrows this table.
    other = GpuSpec("NVIDIA H100 PCIe", 132, H200.smem_per_sm, 3.0e6)
    _, sources = resolve_policies(2112, 7168, [1], gpu=other, weight_dtype=torch.bfloat16, output_dtype=torch.bfloat16)
    assert sources == {1: "heuristic"}
    _, sources = resolve_policies(2112, 7168, [1], gpu=H200, weight_dtype=torch.bfloat16, output_dtype=torch.float32)
    assert sources == {1: "heuristic"}
    # Batches may come from a generator, read once.
    found, sources = resolve_policies(2112, 7168, (b for b in (1, 16)), gpu=H200, weight_dtype=torch.bfloat16,
                                      output_dtype=torch.bfloat16)
    assert sources == {1: "table", 16: "heuristic"} and set(found) == {1, 16}


def test_tables_of_your_own_replace_the_shipped_shapes_they_hold(tmp_path, monkeypatch):
    untabled = GpuSpec("NVIDIA H100 PCIe", 132, H200.smem_per_sm, 3.0e6)
    mine, later = tmp_path / "mine.json", tmp_path / "later.json"
    tables.write_table(mine, [entry(1, SplitKTactic(128, 8, 4, 13), gpu=untabled.name),
                              entry(8, SplitKTactic(64, 8, 2, 25))],
                       dsl_version="4.8.1", measured="2026-12-05")
    tables.write_table(later, [entry(1, SplitKTactic(64, 16, 2, 20), gpu=untabled.name)], dsl_version="4.8.1",
                       measured="2026-12-05")

    def resolved(gpu, batches=(1, 8, 16)):
        return resolve_policies(2112, 7168, batches, gpu=gpu, weight_dtype=torch.bfloat16,
                                output_dtype=torch.bfloat16)

    monkeypatch.delenv(tables.USER_TABLES, raising=False)
    assert resolved(H200)[1] == {1: "table", 8: "table", 16: "table"}  # the shipped H200 table
    assert resolved(untabled)[1] == {1: "heuristic", 8: "heuristic", 16: "heuristic"}
    monkeypatch.setenv(tables.USER_TABLES, str(mine))
    found, sources = resolved(untabled, (1, 8))
    assert found[1] == SplitKTactic(128, 8, 4, 13) and sources == {1: "table", 8: "heuristic"}
    # The H200's 2112 x 7168 is replaced whole: a batch the shipped table held and this one lacks is the heuristic's.
    found, sources = resolved(H200)
    assert found[8] == SplitKTactic(64, 8, 2, 25) and sources == {1: "heuristic", 8: "table", 16: "heuristic"}
    assert resolve_policies(3584, 7168, [1], gpu=H200, weight_dtype=torch.bfloat16,
                            output_dtype=torch.bfloat16)[1] == {1: "table"}  # a shape it does not hold stays shipped
    monkeypatch.setenv(tables.USER_TABLES, os.pathsep.join(["", str(mine), str(later)]))
    assert resolved(untabled, (1,))[0] == {1: SplitKTactic(64, 16, 2, 20)}  # the later path wins
    missing, not_a_table = tmp_path / "missing.json", tmp_path / "empty.json"
    not_a_table.write_text("{}")
    for unusable in (missing, not_a_table):
        monkeypatch.setenv(tables.USER_TABLES, str(unusable))
        with pytest.raises(ValueError, match=f"DECODE_PROJECTION_TABLES names {unusable}, which is not a usable"):
            resolved(untabled)


def test_batch_invariant_table_fixes_the_split_for_uncovered_batches(monkeypatch, tmp_path):
    path = tmp_path / "inv.json"
    tables.write_table(path, [entry(1, SplitKTactic(64, 8, 2, 25), invariant=True)], dsl_version="4.8.1",
                       measured="2026-12-02")
    monkeypatch.setattr(tables, "shipped_tables", lambda: tables.load_table(path))
    found, sources = resolve_policies(2112, 7168, [1, 3, 100, 256], gpu=H200, weight_dtype=torch.bfloat16,
                                      output_dtype=torch.bfloat16, batch_invariant=True)
    assert {t.split for t in found.values()} == {2}
    assert sources[1] == "table" and sources[256] == "heuristic"
    # Even when no requested batch is in the table, its split holds.
    found, _ = resolve_policies(2112, 7168, [5], gpu=H200, weight_dtype=torch.bfloat16,
                                output_dtype=torch.bfloat16, batch_invariant=True)
    assert found[5].split == 2


def test_batch_invariant_table_with_two_splits_is_refused(tmp_path):
    path = tmp_path / "mixed.json"
    tables.write_table(path, [entry(1, SplitKTactic(64, 8, 2, 25), invariant=True),
                              entry(8, SplitKTactic(64, 8, 4, 12), invariant=True)],
                       dsl_version="4.8.1", measured="2026-12-02")
    with pytest.raises(ValueError, match="mixes summation orders"):
        tables.load_table(path)


def test_stale_table_entry_fails_loudly(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": 2, "entries": [entry(1, SplitKTactic(64, 12, 2, 4))]}))
    with pytest.raises(ValueError, match="no longer valid"):
        tables.load_table(path)
    path.write_text(json.dumps({"format": 99, "entries": []}))
    with pytest.raises(ValueError, match="format"):
        tables.load_table(path)
    # Whatever is wrong, the message names the file.
    good = entry(1, SplitKTactic(64, 8, 2, 4))
    malformed = {
        2: [{**good, "batch": "1"}, {"batch": 1, "tactic": good["tactic"]}, {**good, "n": [7168]},
            {**good, "batch_invariant": "yes"}, {**good, "batch": True}, "an entry",
            {**good, "tactic": [64, 8, 2, 4]},  # format 2 stores tactics by field name
            {**good, "tactic": {**good["tactic"], "kboxes": 2}}, {**good, "tactic": {"weight_rows": 64}}],
        1: [{**good, "tactic": [64, "eight"]}, {**good, "tactic": [64, 8, 2]}, {**good, "tactic": "64,8,2,4"}],
    }
    for version, entries in malformed.items():
        for bad in entries:
            path.write_text(json.dumps({"format": version, "entries": [bad]}))
            with pytest.raises(ValueError, match="bad.json: entry"):
                tables.load_table(path)
    too_long = b'{"format": 2, "entries": [' + b"9" * 5000 + b"]}"  # past Python's digits for an int
    for broken in (b'{"format": 2, "entries": [', b"\xff\xfe not text", too_long):
        path.write_bytes(broken)
        with pytest.raises(ValueError, match="bad.json: not a JSON table"):
            tables.load_table(path)


@pytest.mark.parametrize("claimed", [True, 2.0, 1.0, "2", None, [2]])
def test_a_table_format_is_exactly_the_integer_it_claims(tmp_path, claimed):
    path = tmp_path / "claims.json"
    path.write_text(json.dumps({"format": claimed, "entries": []}))
    with pytest.raises(ValueError, match="claims.json: table format"):
        tables.load_table(path)


@pytest.mark.parametrize("opening, closing", [("[", "]"), ('{"entries": ', "}")])
def test_deeply_nested_json_is_refused_as_a_table(tmp_path, opening, closing):
    path = tmp_path / "deep.json"
    path.write_text(opening * 100_000 + closing * 100_000)
    with pytest.raises(ValueError, match="deep.json: not a JSON table: nested too deeply"):
        tables.load_table(path)


def test_a_table_that_is_not_a_regular_file_is_refused_unopened(tmp_path):
    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)
    outcome = []

    def load():  # with no writer, opening the FIFO to read would block: in a thread the test sees that
        try:
            tables.load_table(fifo)
        except ValueError as error:
            outcome.append(str(error))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert outcome == [f"{fifo}: not a regular file"]
    with pytest.raises(ValueError, match="/dev/null: not a regular file"):
        tables.load_table("/dev/null")


def test_old_and_new_table_formats_read_to_identical_policies(tmp_path, monkeypatch):
    """The shipped tables, written back in format 1 (each tactic a list of its fields in order, the trailing fold
    left out where it is 1 as the first format-1 tables did), load to the same tactics."""
    old_paths = []
    for path in sorted(tables.SHIPPED.glob("*.json")):
        document = json.loads(path.read_text())
        assert document["format"] == 2
        for stored in document["entries"]:
            fields = list(stored["tactic"].values())
            stored["tactic"] = fields[:-1] if fields[-1] == 1 and stored["batch"] % 2 else fields
        old = tmp_path / path.name
        old.write_text(json.dumps({**document, "format": 1}))
        assert tables.load_table(old) == tables.load_table(path)
        old_paths.append(str(old))
    monkeypatch.setenv(tables.USER_TABLES, os.pathsep.join(old_paths))
    assert tables.tables_in_use() == tables.shipped_tables()


def test_a_table_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "table.json"
    tables.write_table(path, [entry(1, SplitKTactic(64, 8, 2, 4))], dsl_version="4.8.1", measured="2026-12-05")
    before = path.read_text()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tables.Path, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        tables.write_table(path, [entry(8, SplitKTactic(64, 8, 2, 4))], dsl_version="4.8.1", measured="2026-12-05")
    assert path.read_text() == before


def test_shipped_tables_load():
    for key, batches in tables.shipped_tables().items():
        assert key.gpu and key.sm_count > 0
        # Streaming batches fit one activation tile; compute-bound ones may be tiled.
        assert all((t.activation_rows >= b or b >= policies.COMPUTE_BOUND_ROWS) for b, t in batches.items())


@pytest.mark.parametrize("invariant", [False, True])
def test_shipped_h200_tables_cover_the_workload(invariant):
    shipped = tables.shipped_tables()
    for n, k in KIMI_K3_SHAPES:
        key = tables.TableKey.for_cell(H200, n, k, weight_dtype=torch.bfloat16, output_dtype=torch.bfloat16,
                                       batch_invariant=invariant)
        assert sorted(shipped[key]) == list(DECODE_BATCHES)
        if invariant:
            assert len({t.summation_order for t in shipped[key].values()}) == 1


def test_wide_stage_candidates_keep_shared_memory_and_cover_k():
    for (n, k) in KIMI_K3_SHAPES:
        for batch in (1, 64):
            found = candidate_tactics(n, k, batch, limit=12)
            wide = [t for t in found if t.k_boxes > 1]
            assert all(t.valid and candidates.fills_every_rank(t, k) for t in wide)
            if k >= 1536:
                assert wide, f"{n}x{k} M={batch}: no wide stages timed"
    narrow = SplitKTactic(64, 8, 2, 25)
    assert with_k_boxes(narrow, 4) == SplitKTactic(64, 8, 2, 6, k_boxes=4)
    assert with_k_boxes(narrow, 4).smem_bytes <= narrow.smem_bytes


def test_weight_as_b_candidates_fill_the_sms_from_32_activation_rows_on():
    for (n, k) in KIMI_K3_SHAPES:
        for batch in (1, 16):
            assert not any(t.weight_as_b for t in candidate_tactics(n, k, batch, limit=16))
        for batch in (24, 64, 96, 256):
            found = [t for t in candidate_tactics(n, k, batch, limit=16) if t.weight_as_b]
            assert found and all(t.valid for t in found), f"{n}x{k} M={batch}"
    # 7168 rows at 256: 64 tiles of 112 rows x 2 activation tiles, one wave, where 64-row tiles fill 112 SMs.
    best_unsplit = filling_tactics(7168, 14336, 256, weight_as_b=True)[0]
    assert (best_unsplit.weight_rows, best_unsplit.activation_rows, best_unsplit.split) == (112, 128, 1)
    assert grid_ctas(best_unsplit, 7168, 256) == 128 and waves(best_unsplit, 7168, 256) == 1
    # At M=64 one 64-row activation tile: 6288 rows in 131 tiles of 48, the fastest an H200 probe timed.
    streaming = filling_tactics(6288, 7168, 64, weight_as_b=True)[0]
    assert (streaming.weight_rows, streaming.activation_rows, streaming.split) == (48, 64, 1)
    assert grid_ctas(streaming, 6288, 64) == 131


def test_shared_weight_tiles_serve_the_whole_batch_in_one_wave():
    """Shared-weight candidates: every activation tile of the batch shares each weight tile, clusters in one wave;
    tiles partly past the batch only where no tile divides it."""
    for (n, k) in KIMI_K3_SHAPES:
        for batch in (96, 128, 192, 256):
            for tactic in candidates.shared_weight_tactics(n, k, batch):
                assert tactic.valid and tactic.weight_as_b, tactic
                assert tactic.multicast == math.ceil(batch / tactic.activation_rows), tactic
                assert batch % tactic.activation_rows == 0 or batch == 96, tactic
                assert waves(tactic, n, batch) == 1, tactic
    # At M=96 two 64-row tiles, the second moved back to rows 32-95: 66 clusters of 2 on 6288 rows (docs/compute-bound-tiling.md).
    offered = candidates.shared_weight_tactics(6288, 7168, 96)
    assert SplitKTactic(96, 64, 1, 11, multicast=2, weight_as_b=True) in offered
    # Three 64-row activation tiles share 96-row weight tiles: 32 clusters of 3 (docs/compute-bound-tiling.md).
    assert candidates.shared_weight_tactics(3072, 7168, 192)[0] == SplitKTactic(96, 64, 1, 11, multicast=3,
                                                                                 weight_as_b=True)
    assert SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True) in candidate_tactics(7168, 14336, 256, limit=16)
    # Three 64-row activation tiles with pairs would take two pairs, the last wholly past the batch.
    assert grid_ctas(SplitKTactic(112, 64, 1, 7, multicast=2, weight_as_b=True), 7168, 192) == 64 * 4
    assert grid_ctas(SplitKTactic(112, 64, 1, 7, multicast=2), 7168, 192) == 64 * 3


def test_the_tuner_still_times_what_the_one_wave_rules_turned_away_from():
    # A pick in two column groups or in 2-box stages is timed next to its twin in one group and in one-box
    # stages (the same boxes in flight), so that every tune keeps judging those rules.
    for gpu in KNOWN_GPUS.values():
        for (n, k) in KIMI_K3_SHAPES:
            for batch in (96, 128, 192):
                # An early pick is offered late, and the tuner adds its early twin (early_dependents_tactics).
                pick = replace(default_tactic(n, k, batch, gpu), dependents_at_start=False)
                offered = candidate_tactics(n, k, batch, gpu, limit=12)
                assert pick in offered
                if pick.column_groups == 2:
                    assert replace(pick, column_groups=1) in offered, f"{n}x{k} M={batch}"
                if pick.k_boxes == 2 and not pick.weight_as_b:
                    assert with_k_boxes(pick, 1) in offered, f"{n}x{k} M={batch}"


def test_wide_activation_tiles_take_64_row_split_tiles_timed_next_to_the_128_row_pick():
    # From 48 activation rows on the split rule takes 64-row tiles; the 128-row pick it turned away from (2112 rows:
    # split 3, 1536 rows: split 8) is among the tuner's candidates. Not under batch invariance (batch 1's tiles).
    for gpu in KNOWN_GPUS.values():
        for (n, k), narrow_split in (((2112, 7168), 3), ((1536, 7168), 8), ((3072, 7168), 4), ((2304, 1536), 3)):
            for batch in (48, 64):
                wide = split_rule_tactic(n, k, batch, gpu)
                assert wide.weight_rows == 64, f"{n}x{k} M={batch}"
                twin = split_rule_tactic(n, k, batch, gpu, wide_rule=False)
                assert (twin.weight_rows, twin.split) == (128, narrow_split)
                pick = default_tactic(n, k, batch, gpu)
                if pick == wide:  # else a short filling tile took the cell (the next test)
                    assert twin in candidate_tactics(n, k, batch, gpu, limit=12), f"{n}x{k} M={batch}"
            assert split_rule_tactic(n, k, 32, gpu) == split_rule_tactic(n, k, 32, gpu, wide_rule=False)
    assert default_tactic(1536, 7168, 64, H100) == split_rule_tactic(1536, 7168, 64, H100)
    assert default_tactic(2112, 7168, 64, batch_invariant=True).weight_rows == 128
    assert candidates.rule_twins(default_tactic(2112, 7168, 64), 2112, 7168, 64, order=(4, 1)) == []


def test_short_filling_tiles_only_where_they_keep_the_read_ceiling_in_flight():
    # 16-24-row tiles, one per SM, from 32 activation rows on where the grid's weight in flight covers the card's
    # read ceiling over the load latency: on the H100 2112 x 7168 (16 rows, 132 CTAs) at M = 24-48 (at 64 the
    # stages are too few), 2304 x 1536 and 3072 x 7168 (24 rows) at M = 24-64; on the H200 only 3072 x 7168 at
    # M = 24-48. Never 1536 x 7168's 16-row tiles (96 CTAs) or at M <= 16; the split rule's pick is timed beside.
    expected = {H100: {(2112, 7168): (24, 32, 48), (2304, 1536): (24, 32, 48, 64), (3072, 7168): (24, 32, 48, 64)},
                H200: {(3072, 7168): (24, 32, 48)}}
    for gpu, cells in expected.items():
        for (n, k) in ((2112, 7168), (2304, 1536), (3072, 7168), (1536, 7168), (1536, 128), (3072, 128)):
            for batch in (16, 24, 32, 48, 64):
                pick = default_tactic(n, k, batch, gpu)
                short = pick.split == 1 and pick.fold == 1 and pick.weight_rows < MIN_FILLING_ROWS
                assert short == (batch in cells.get((n, k), ())), f"{gpu.name} {n}x{k} M={batch}: {pick}"
                if not short:
                    continue
                assert pick.weight_rows == covering_rows(n, gpu.sm_count) and pick.dependents_at_start
                assert weight_bytes_in_flight(pick, n, k, batch, gpu) >= gpu.hbm_bytes_per_us * LOADED_LATENCY_US
                rule = split_rule_tactic(n, k, batch, gpu)
                assert candidates.rule_twins(replace(pick, dependents_at_start=False), n, k, batch,
                                                       gpu) == [rule]
                assert rule in candidate_tactics(n, k, batch, gpu, limit=12), f"{n}x{k} M={batch}"
    # In flight: each resident CTA's stages, at most its rank's K tiles, of weight rows.
    assert weight_bytes_in_flight(SplitKTactic(16, 32, 1, 9, k_boxes=2), 2112, 7168, 32) == 132 * 9 * 16 * 128 * 2
    assert weight_bytes_in_flight(SplitKTactic(64, 32, 1, 18), 3072, 128, 32) == 48 * 2 * 64 * 64 * 2


def assert_one_weight_as_b_tile_per_sm(rule, n, k, gpu, *, rows, ctas):
    """``rule`` picks the heuristic's tactic for ``n`` x ``k`` at M = 128 and 192: one unsplit ``rows``-row tile per
    SM with the weight as B over the batch (``ctas`` of them, one wave), the one-wave rule's grid it turned away from
    still timed (``candidates.rule_twins``); not at M = 96 (the weight as B would pad the batch), and at M = 256 the
    shared-weight rule comes first."""
    for batch in (128, 192):
        pick = default_tactic(n, k, batch, gpu)
        assert pick == rule(n, k, batch, gpu), f"M={batch}"
        assert (pick.weight_rows, pick.activation_rows, pick.split, pick.weight_as_b) == (rows, batch, 1, True)
        assert grid_ctas(pick, n, batch) == ctas and waves(pick, n, batch, gpu) == 1
        assert candidates.rule_twins(pick, n, k, batch, gpu) == [one_wave_tactic(n, k, batch, gpu)]
    assert rule(n, k, 96, gpu) is None
    assert default_tactic(n, k, 256, gpu) == shared_weight_tactic(n, k, 256, gpu)


def test_weights_no_one_wave_grid_fits_to_the_sms_take_one_weight_as_b_tile_per_sm():
    # 6288 x 7168: the one-wave grid is 50 tiles of 128 rows split 2 (100 CTAs); 131 tiles of 48 rows as B run more,
    # unsplit, at M = 128 and 192 on both cards. At M = 96 the weight as B would pad the batch, at M = 256 the
    # shared-weight rule comes first.
    for gpu in KNOWN_GPUS.values():
        assert_one_weight_as_b_tile_per_sm(more_sms_as_b_tactic, 6288, 7168, gpu, rows=48, ctas=131)
        # Tiles under MIN_SHARED_WEIGHT_ROWS (2112 rows: 16 a tile), or no more CTAs than the one-wave grid (7168
        # and 8448 rows: 112 and 132 either way): the one-wave rule.
        for n in (2112, 7168, 8448):
            assert more_sms_as_b_tactic(n, 7168, 128, gpu) is None, n


def test_weights_too_short_along_k_to_split_take_one_weight_as_b_tile_per_sm():
    # 2304 x 1536: 24 K tiles (a split of 2 leaves ranks under 16) and 36 tiles of 64 rows, under 70% of the SMs:
    # at M = 128 and 192 one 24-row tile per SM with the weight as B on both cards, not the split grid; at M = 96 the
    # weight as B would pad the batch (the one-wave rule stays), at M = 256 the shared-weight rule comes first.
    for gpu in KNOWN_GPUS.values():
        assert_one_weight_as_b_tile_per_sm(unsplit_k_tactic, 2304, 1536, gpu, rows=24, ctas=96)
        for batch in (128, 192):
            assert one_wave_tactic(2304, 1536, batch, gpu) in candidate_tactics(2304, 1536, batch, gpu, limit=12)
        # K long enough to split (7168), or 64-row tiles that fill the SMs unsplit (7168 rows): the other rules.
        assert unsplit_k_tactic(2304, 7168, 128, gpu) is None and unsplit_k_tactic(7168, 1536, 128, gpu) is None


def test_a_streaming_pick_split_3_or_4_is_timed_next_to_its_twin_in_the_other():
    # 2112 rows (17 tiles of 128) reach the CTA target split 3 in 51 CTAs, within half the SMs: split 3, its split-4
    # twin (the former pick) timed next to it; 3072 rows (24 tiles) would take 72 split 3, so split 4 and its split-3
    # twin in one-box stages.
    for gpu in KNOWN_GPUS.values():
        for batch in (16, 24, 32):
            rule = split_rule_tactic(2112, 7168, batch, gpu)  # the H100's pick from M = 24 on: a short filling tile
            assert rule.split == 3 and candidates.split_twins(rule, 7168) == [replace(rule, split=4)]
            if default_tactic(2112, 7168, batch, gpu) == rule:
                assert replace(rule, split=4) in candidate_tactics(2112, 7168, batch, gpu, limit=12), f"M={batch}"
        for batch in (24, 32):
            rule = split_rule_tactic(3072, 7168, batch, gpu)  # both cards pick a short filling tile here instead
            assert rule.split == 4
            twin = SplitKTactic(rule.weight_rows, rule.activation_rows, 3,
                                max_stages(rule.weight_rows, rule.activation_rows, 3))
            assert candidates.split_twins(rule, 7168) == [twin], f"M={batch}"
    # Not under a pinned order or batch invariance, and not for other splits or compute-bound picks.
    assert candidates.split_twins(default_tactic(2112, 7168, 24), 7168, order=(4, 2)) == []
    assert default_tactic(2112, 7168, 24, batch_invariant=True).split == 4
    assert default_tactic(1536, 7168, 16).split == 8 and candidates.split_twins(
        default_tactic(1536, 7168, 16), 7168) == []
    assert candidates.split_twins(SplitKTactic(128, 128, 4, 4), 7168) == []


def test_padded_weight_tiles_fill_the_sms_at_streaming_batches():
    # 7168 rows: 128 tiles of 56 (padded to one warpgroup); 6288: 131 of 48; 20480: 128 of 160 (three warpgroups).
    for (n, rows, ctas) in ((7168, 56, 128), (6288, 48, 131), (20480, 160, 128)):
        for batch in (1, 16, 64):
            best = filling_tactics(n, 7168, batch, weight_as_b=False)[0]
            assert (best.weight_rows, best.split, best.weight_as_b) == (rows, 1, False)
            assert best.weight_smem_rows == 64 * math.ceil(rows / 64) and grid_ctas(best, n, batch) == ctas
            # Offered in stages of 4 or 2 boxes too: the deepest one-box pipeline lost after glue on 48-56 rows.
            offered = [t for t in candidate_tactics(n, 7168, batch, limit=16) if t.weight_smem_rows > t.weight_rows]
            pick = default_tactic(n, 7168, batch)
            assert any(replace(t, stages=best.stages, k_boxes=1) == best and t.k_boxes > 1 and t != pick
                       for t in offered), f"{n} M={batch}"
    for (n, k) in KIMI_K3_SHAPES:
        assert all(t.weight_smem_rows == t.weight_rows for t in candidate_tactics(n, k, 128, limit=20))
    # Up to 96 activation rows: 6288 x 7168 M=96 on 131 tiles of 48 in 2-box stages, an H200 probe's fastest.
    assert SplitKTactic(48, 96, 1, 5, k_boxes=2) in candidate_tactics(6288, 7168, 96, limit=20)
    # Under a pinned summation order, one padded tile of that order (it sums as the whole tile does).
    pinned = candidate_tactics(7168, 4224, 1, limit=16, order=(1, 2))
    assert {t.summation_order for t in pinned} == {(1, 2)}
    assert [t.weight_rows for t in pinned if t.weight_smem_rows > t.weight_rows] == [56]


def test_folded_tiles_fill_the_sms_in_one_warpgroup_tile_at_streaming_batches():
    # 3584 rows: 128 tiles of 28 in slots of 32 (two K segments); 2112: 132 tiles of 16, in four segments first
    # where four fit in shared memory three stages deep.
    for (n, rows, folds, ctas) in ((3584, 28, {1: [2, 2], 64: [2, 2]}, 128), (2112, 16, {1: [4, 2], 64: [2, 4]}, 132)):
        for batch in (1, 16, 64):
            offered = [t for t in candidate_tactics(n, 7168, batch, limit=16) if t.fold > 1]
            assert [t.fold for t in offered] == folds[1 if batch < 64 else 64], f"{n} M={batch}"
            assert {t.weight_rows for t in offered} == {rows}
            assert all(t.valid and t.split == 1 and t.stages >= 3 and grid_ctas(t, n, batch) == ctas for t in offered)
            assert all(t.stage_load_bytes == t.fold * (rows + t.activation_rows) * t.tile_k * 2 for t in offered)
    # Never where 64-row tiles already fill the SMs or at compute-bound batches; under a pinned order, the
    # folds that sum in it (a fold of 2 as a split of 2).
    assert not [t for t in candidate_tactics(7168, 3584, 1, limit=16) if t.fold > 1]
    assert not [t for t in candidate_tactics(3584, 7168, 96, limit=16) if t.fold > 1]
    assert not [t for t in candidate_tactics(3584, 7168, 1, limit=16, order=(1, 4)) if t.fold > 1]
    pinned = [t for t in candidate_tactics(3584, 7168, 1, limit=16, order=(2, 1)) if t.fold > 1]
    assert [(t.weight_rows, t.fold, t.k_boxes) for t in pinned] == [(28, 2, 1)]


def test_folded_tactics_are_checked():
    folded = SplitKTactic(28, 8, 1, 5, k_boxes=4, fold=2)
    assert folded.valid and folded.tile_mnk == (64, 16, 256) and folded.slot_rows == 32 and folded.label.endswith("F2)")
    # A fold of 2 sums in the K slices of a split of 2, in the same order.
    assert folded.summation_order == SplitKTactic(64, 8, 2, 6, k_boxes=4).summation_order == (2, 4)
    for bad in (replace(folded, weight_rows=33), replace(folded, split=2), replace(folded, multicast=2),
                replace(folded, weight_as_b=True), replace(folded, fold=3), replace(folded, activation_rows=256, stages=2)):
        assert not bad.valid, bad


def test_a_weight_as_b_order_cannot_be_pinned():
    with pytest.raises(ValueError, match="weight as A only"):
        default_tactic(7168, 7168, 256, order=SplitKTactic(112, 128, 1, 4, weight_as_b=True).summation_order)


def test_pinned_summation_order_is_kept_for_every_batch():
    for batch in (1, 64, 256):
        pick = default_tactic(2112, 7168, batch, order=(2, 4))
        assert pick.valid and pick.summation_order == (2, 4)
        pinned = candidate_tactics(2112, 7168, batch, limit=6, order=(2, 4))
        assert {t.summation_order for t in pinned} == {(2, 4)} and not any(t.weight_as_b for t in pinned)


# Batch-invariant tables the loader refuses: (batch, tactic) entries and the reason it gives.
REFUSED_INVARIANT_TABLES = {
    "mixed-k-boxes": ([(1, SplitKTactic(64, 8, 2, 6, k_boxes=4)), (16, SplitKTactic(64, 16, 2, 12))],
                      "mixes summation orders"),
    # Invariance is verified with the weight as A only.
    "weight-as-b": ([(64, SplitKTactic(64, 64, 2, 6)), (256, SplitKTactic(112, 128, 2, 4, weight_as_b=True))],
                    "weight as A only"),
    # A fold of 2 sums as a split of 2, not as an unsplit tile.
    "folded-unsplit": ([(1, SplitKTactic(28, 8, 1, 5, k_boxes=4, fold=2)), (64, SplitKTactic(32, 64, 1, 3, k_boxes=4))],
                       "mixes summation orders"),
}


@pytest.mark.parametrize("name", REFUSED_INVARIANT_TABLES)
def test_batch_invariant_table_is_refused(tmp_path, name):
    entries, reason = REFUSED_INVARIANT_TABLES[name]
    path = tmp_path / f"{name}.json"
    tables.write_table(path, [entry(batch, tactic, invariant=True) for batch, tactic in entries],
                       dsl_version="test", measured="today")
    with pytest.raises(ValueError, match=reason):
        tables.load_table(path)


def test_batch_invariant_table_may_hold_padded_and_folded_tiles_of_its_order(tmp_path):
    path = tmp_path / "padded.json"
    tables.write_table(path, [entry(1, SplitKTactic(64, 8, 1, 6, k_boxes=2), invariant=True),
                              entry(32, SplitKTactic(56, 32, 1, 9, k_boxes=2), invariant=True)],
                       dsl_version="test", measured="today")
    assert tables.load_table(path)
    path = tmp_path / "folded.json"
    tables.write_table(path, [entry(1, SplitKTactic(28, 8, 1, 5, k_boxes=4, fold=2), invariant=True),
                              entry(64, SplitKTactic(64, 64, 2, 3, k_boxes=4), invariant=True)],
                       dsl_version="test", measured="today")
    assert tables.load_table(path)


def test_free_table_may_hold_what_invariant_tables_may_not(tmp_path):
    assert SplitKTactic(112, 128, 2, 4, weight_as_b=True).summation_order != SplitKTactic(64, 128, 2, 4).summation_order
    path = tmp_path / "free.json"
    tables.write_table(path, [entry(32, SplitKTactic(56, 32, 1, 9, k_boxes=2)),
                              entry(256, SplitKTactic(112, 128, 2, 4, weight_as_b=True))],
                       dsl_version="test", measured="today")
    assert tables.load_table(path)


def test_device_index_accepts_ints_strings_and_devices():
    assert device_index(3) == 3
    assert device_index("cuda:1") == 1
    assert device_index(torch.device("cuda", 2)) == 2


def test_waves_count_whole_clusters_per_gpc():
    spec = replace(H200, cluster_slots=(132, 66, 44, 32))
    # 33 clusters of 4 CTAs: one CTA per SM would fit 132, but only 32 clusters of 4 fit at once.
    tactic = SplitKTactic(192, 256, 4, 4)
    assert policies.grid_ctas(tactic, 6288, 256) == 132
    assert policies.waves(tactic, 6288, 256, spec) == 2
    assert policies.waves(tactic, 6288, 256, replace(H200, cluster_slots=())) == 1  # SMs / size


def test_early_dependents_are_offered_for_streaming_unclustered_weight_as_a_tiles_alone_on_an_sm():
    tactics = [SplitKTactic(128, 96, 1, 7), SplitKTactic(64, 8, 4, 6), SplitKTactic(128, 64, 1, 7),
               SplitKTactic(56, 64, 1, 4, weight_as_b=True), SplitKTactic(64, 8, 1, 6, k_boxes=4),
               SplitKTactic(56, 32, 1, 5),
               SplitKTactic(128, 8, 1, 6), SplitKTactic(48, 8, 1, 6, k_boxes=4), SplitKTactic(96, 16, 1, 12)]
    assert policies.ctas_per_sm(tactics[0]) == 1 and tactics[0].activation_rows >= policies.COMPUTE_BOUND_ROWS
    assert policies.ctas_per_sm(tactics[6]) == 2
    early = early_dependents_tactics(tactics)
    # The first three eligible, in order: the staged 64-row tile too; the last one is past the cap.
    assert early == [replace(t, dependents_at_start=True) for t in (tactics[2], tactics[4], tactics[7])]
    assert all(t.valid and policies.ctas_per_sm(t) == 1 for t in early)
    assert early_dependents_tactics(early) == []


def test_split_partials_get_shared_memory_of_their_own_where_it_fits():
    # 4 stages of 24 KB leave room for the 32 KB of partials, one CTA per SM either way: sent as each rank's loop
    # ends, no cluster barrier first.
    beside = SplitKTactic(128, 32, 4, 5, k_boxes=2)
    assert beside.reduction_buffered and beside.smem_bytes == 1024 + 5 * beside.stage_bytes + beside.reduction_bytes
    # 7 two-box stages fill shared memory: the partials reuse the drained stages.
    reusing = SplitKTactic(56, 64, 2, 7, k_boxes=2)
    assert not reusing.reduction_buffered and reusing.smem_bytes == 1024 + 7 * reusing.stage_bytes
    # The owner keeps its own partials in registers: the buffer holds a slot per peer. Not with three consumer
    # warpgroups, whose accumulators leave too few registers.
    assert SplitKTactic(128, 8, 3, 13).reduction_bytes == 2 * 128 * 4 * 4
    assert not SplitKTactic(192, 192, 6, 4).keeps_own_partials and SplitKTactic(192, 192, 6, 4).reduction_slots == 6
    # Two CTAs share an SM with 7 stages of 16 KB, one with the 12 KB of peers' partials beside them: no buffer
    # there, but with 6 stages.
    assert policies.ctas_per_sm(SplitKTactic(64, 64, 3, 7)) == 2 and not SplitKTactic(64, 64, 3, 7).reduction_buffered
    assert policies.ctas_per_sm(SplitKTactic(64, 64, 3, 6)) == 2 and SplitKTactic(64, 64, 3, 6).reduction_buffered
    assert not SplitKTactic(64, 64, 1, 7).reduction_buffered
    # The tuner times split tactics in fewer stages that give their partials a buffer at as many CTAs per SM:
    # two per SM for the 64-row tile, one for the others.
    assert candidates.buffered_partials_tactics(
        [SplitKTactic(64, 64, 3, 7), SplitKTactic(128, 8, 3, 13), SplitKTactic(56, 64, 2, 7, k_boxes=2),
         SplitKTactic(128, 32, 4, 5, k_boxes=2)]) == [SplitKTactic(64, 64, 3, 6), SplitKTactic(56, 64, 2, 6, k_boxes=2)]
    offered = [t for t in candidate_tactics(2304, 1536, 64, limit=12) if t.reduction_buffered and t.split > 1]
    assert any(policies.ctas_per_sm(t) == 2 for t in offered)
    # The batch-invariant pass on 3584 x 7168 (order (2, 2)) times the padded split tile's buffered twin.
    assert SplitKTactic(56, 64, 2, 6, k_boxes=2) in candidate_tactics(3584, 7168, 64, limit=6, order=(2, 2))
    # Shared-weight tiles get a buffered twin of their own, the one that keeps the largest share of its stages:
    # 7 of 8 for the 80-row split of 2 on 2112 x 7168 M=256, 4 of 6 for the cost model's 144-row split of 4.
    shared = candidates.shared_weight_tactics(2112, 7168, 256)
    assert SplitKTactic(80, 128, 2, 8, multicast=2, weight_as_b=True) in shared[candidates.SHARED_WEIGHT_CANDIDATES:]
    assert candidates.buffered_keeping_most_stages(shared)[:2] == [
        SplitKTactic(80, 128, 2, 7, multicast=2, weight_as_b=True),
        SplitKTactic(160, 64, 2, 7, multicast=4, weight_as_b=True)]
    assert SplitKTactic(80, 128, 2, 7, multicast=2, weight_as_b=True) in candidate_tactics(2112, 7168, 256, limit=16)


def test_a_cluster_no_sm_group_can_hold_is_never_chosen():
    """A GPU that runs no cluster of 8 at once (a measured residency of 0, as a partitioned GPU might): such
    tactics cost infinite waves, and neither the heuristic nor the tuner's candidates offer them."""
    small = GpuSpec("small Hopper", 132, H200.smem_per_sm, 4.0e6, (132, 66, 39, 30, 22, 17, 15, 0))
    assert policies.waves(SplitKTactic(64, 8, 8, 4), 2112, 1, small) == math.inf
    assert default_tactic(1536, 7168, 16).split == 8  # on the H200 (batches up to 8 fold K instead)
    for batch in (1, 16, 64, 128, 256):
        for invariant in (False, True):
            assert default_tactic(1536, 7168, batch, small, batch_invariant=invariant).split < 8
        for n, k in ((1536, 7168), (2112, 7168), (7168, 3584)):
            for tactic in candidate_tactics(n, k, batch, small, limit=16):
                assert small.clusters_at_once(tactic.split * tactic.multicast) > 0, (n, k, batch, tactic)


def test_a_weight_under_a_pipelines_k_gets_the_fewest_streaming_tiles_that_reach_a_third_of_the_sms():
    # One K tile (K = 128): unsplit tiles over a half or a quarter of the batch, 44 or more CTAs on 132 SMs, the
    # taller weight tile on a tie (1536 rows at M=128: 12 x 4 CTAs of 128 x 32 rather than 24 x 2 of 64 x 64).
    for (n, batch), (rows, acts, ctas) in {(1536, 96): (64, 48, 48), (1536, 128): (128, 32, 48),
                                           (1536, 192): (128, 48, 48), (3072, 192): (128, 48, 96)}.items():
        tactic = policies.short_k_tactic(n, 128, batch)
        assert (tactic.weight_rows, tactic.activation_rows, tactic.split) == (rows, acts, 1), (n, batch)
        assert grid_ctas(tactic, n, batch) == ctas and tactic.dependents_at_start
        assert default_tactic(n, 128, batch) == tactic
    # A pipeline's worth of K, or a streaming batch, keeps the other rules.
    assert policies.short_k_tactic(1536, 512, 128) is None
    assert default_tactic(1536, 128, 64).activation_rows == 64
