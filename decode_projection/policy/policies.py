"""Tactic choice without tuning: a heuristic, and the cost model the tuner prunes with (candidates.py).

At decode the projection streams the weight once, so what matters is keeping
enough bytes in flight across the GPU to reach HBM bandwidth, without so many
CTAs that split-K reductions and re-read activations cost more than they hide.
Measured on an H200 (docs/streaming.md): the deepest pipeline that fits wins. A
weight tall enough gets one unsplit tile per SM, each as wide as the SMs leave
it, or for up to 32 rows per SM folding K into one warpgroup tile at small
batches, or for 16-24 rows per SM where the grid keeps the card's read ceiling
times the load latency in flight; for a shorter one about 0.4 CTAs per SM
already saturate HBM when each keeps ~200 KB in flight, and past that, extra
split only adds reduction work. A streaming CTA with an SM to itself lets the
next launch in as it starts. Compute-bound batches (activation tiles of 96 or
more) want the fullest grid that fits in one wave, or where that tiles the batch
(reading the weight more than once) one over the whole batch that fills most of
the SMs; neighbouring weight tiles share each activation load where K is long
enough to share; a weight too tall for any such grid, or too short along K to
split, gets one tile per SM with the weight as B, and one shorter than a
pipeline's worth of K streaming tiles over a third of the SMs.
The rules and their evidence: docs/tactics-and-heuristic.md.
"""

import itertools
import math
from dataclasses import replace
from typing import NamedTuple

from ..kernel.tactic import (
    ACTIVATION_ROWS, ACTIVATION_ROWS_AS_A, BARRIER_BYTES, BOX_K, FOLDS, GATE_GROUP_ROWS, K_BOXES, WEIGHT_ROWS,
    WEIGHT_ROWS_AS_A, WEIGHT_ROWS_AS_B, SplitKTactic, as_tactic, gated_problems, max_stages, resident_ctas,
)
from ..runtime.gpu import H200, GpuSpec
from ..runtime.sm90 import RESERVED_SMEM_PER_CTA, WGMMA_ROWS
from .tables import TableKey, table_policies, table_summation_order

MIN_K_TILES_PER_CTA = 4  # fewer and the pipeline never fills
HEURISTIC_SPLITS = (1, 2, 4, 8)  # the no-table rule keeps to the splits it was measured with
HEURISTIC_WEIGHT_ROWS = (64, 128)  # and to the weight tiles it was measured with (192 is the tuner's to try)
STREAMING_CTA_FRACTION = 0.375  # CTAs per SM that saturate HBM with deep pipelines
SPLIT_THREE_FILL = 0.5  # the streaming rule also splits 3 where that grid keeps within this share of the SMs
COMPUTE_BOUND_ROWS = 96  # activation tiles from here on are bound by the tensor cores
WIDE_ACTIVATION_ROWS = 48  # from this activation tile on, the split rule's weight tiles are 64 rows
MIN_STAGES = 3  # one-box stages: shallower pipelines never won a sweep (wide stages may go to 2)
# A streaming stage takes as many TMA boxes of K as keep it within this: in the H200 timings the fills of
# 48-64 rows won with 4 boxes at M <= 16 and 2 from M = 32 on, the 160-row fill of 20480 x 7168 with 1, and
# 128-row split tiles with 2.
STREAMING_STAGE_BYTES = 40 * 1024
MIN_FILLING_ROWS = WGMMA_ROWS // 2  # fewer rows leave most of a filling tile's 64-row shared-memory tile padding
# Filling tiles of MIN_SHORT_FILLING_ROWS rows to under MIN_FILLING_ROWS only from this activation tile on, and
# only where the grid keeps enough weight in flight to stream at the card's read ceiling (filling_tactic).
MIN_SHORT_FILLING_ROWS = WGMMA_ROWS // 4
MIN_SHORT_FILLING_ACTIVATION_ROWS = 32
# A TMA load's latency while the weight streams: fitted in predicted_time_us on every byte a stage loads, and used
# as it is on the weight's bytes alone by filling_tactic.
LOADED_LATENCY_US = 1.3
# A folded filling tile loads at least this many weight rows into its 64-row warpgroup tile per stage (its rows
# times the fold): 2304 rows in 2-folds of 18 (36 of 64) ran no faster than the split rule.
MIN_FOLDED_WEIGHT_ROWS = 3 * WGMMA_ROWS // 4
MOST_FOLDED_ACTIVATION_ROWS = WGMMA_ROWS // 2  # the fold's activation slots, at most half the weight's tile
SHARED_WEIGHT_PAIRS = 2  # activation tiles of 128 rows sharing each weight tile at M = 193-256
MIN_SHARED_WEIGHT_ROWS = 48  # narrower weight-as-B tiles, shared that way or one per SM, lost to the one-wave rule
ACTIVATION_SHARERS = (4, 2)  # weight tiles sharing an activation load in one-wave grids, the most first
MOST_SHARING_SPLIT = 2  # larger splits with sharing make clusters of 8, which lost
MOST_CTAS_PER_SM = 6  # enough for a 64-row, split-2 grid of the largest shape to fit in one wave
# A one-wave grid over the whole batch in one activation tile (the weight read once) replaces a fuller grid of
# smaller activation tiles where it fills this share of the SMs, with these splits (3 among them: clusters of 4
# fit only 30 at once on these cards), each rank keeping at least COVERING_TILE_K_TILES K tiles.
COVERING_TILE_FILL = 0.7
COVERING_TILE_SPLITS = (1, 2, 3, 4, 8)
COVERING_TILE_K_TILES = 16
SHORT_K_CTA_FRACTION = 1 / 3  # the share of SMs a compute-bound grid of a weight under a pipeline's K fills
SM_FLOPS_PER_US = 5.1e6  # dense BF16 wgmma per SM as fitted, ~70% of the datasheet 989 TFLOPS / 132
SM_BYTES_PER_US = 50e3  # HBM bytes one SM pulls at most, as fitted (~50 GB/s: 132 SMs reach 6.6 TB/s)


def covering_rows(n: int, tiles: int, *, multiple: int = 8) -> int:
    """The fewest weight rows per tile, a multiple of ``multiple``, with which ``tiles`` tiles cover ``n`` rows."""
    return multiple * math.ceil(n / (multiple * tiles))


def activation_rows_for(batch: int) -> int:
    """The smallest legal activation tile covering ``batch`` (256 for larger batches)."""
    return next((rows for rows in ACTIVATION_ROWS if rows >= batch), ACTIVATION_ROWS[-1])


def largest_split(k: int, gpu: GpuSpec = H200) -> int:
    """The largest of HEURISTIC_SPLITS that still gives each CTA a pipeline's worth of K tiles and whose clusters
    ``gpu`` can run (also the tuner's cap: odd splits in between, not past it)."""
    k_tiles = math.ceil(k / BOX_K)
    fitting = [s for s in HEURISTIC_SPLITS if k_tiles >= s * MIN_K_TILES_PER_CTA and gpu.clusters_at_once(s) > 0]
    return max(fitting, default=1)


def default_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200, *, batch_invariant=False, order=None):
    """The heuristic's tactic for one padded batch; ``batch_invariant`` keeps batch 1's split (so the order K is
    summed in), ``order`` = (split, k boxes) pins it instead (to match a tuned batch-invariant table)."""
    acts = activation_rows_for(batch)
    if order is not None:
        return pinned_tactic(n, k, batch, order, gpu)
    if acts >= COMPUTE_BOUND_ROWS and not batch_invariant:
        return (short_k_tactic(n, k, batch, gpu) or shared_weight_tactic(n, k, batch, gpu)
                or unsplit_k_tactic(n, k, batch, gpu) or more_sms_as_b_tactic(n, k, batch, gpu)
                or one_wave_tactic(n, k, batch, gpu))
    filling = None if batch_invariant else folded_tactic(n, k, batch, gpu) or filling_tactic(n, k, batch, gpu)
    if filling is not None:
        return starting_dependents_early(filling, gpu)
    # Streaming batches of shorter weights, and batch-invariant tables at every batch (they keep batch 1's split).
    return starting_dependents_early(split_rule_tactic(n, k, batch, gpu, batch_invariant=batch_invariant), gpu)


def split_rule_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200, *, batch_invariant=False,
                      wide_rule=True) -> SplitKTactic:
    """The streaming rule: 128-row weight tiles where they reach the CTA target split at most ``largest_split`` (64
    rows where they do not, and with ``wide_rule`` from WIDE_ACTIVATION_ROWS activation rows on), split K to reach
    it, in stages of up to STREAMING_STAGE_BYTES (one box under batch invariance)."""
    acts = activation_rows_for(batch)
    target = math.ceil(STREAMING_CTA_FRACTION * gpu.sm_count)
    most = largest_split(k, gpu)
    # One warpgroup issues every wgmma of a 128-row tile; from WIDE_ACTIVATION_ROWS on it falls behind the stream,
    # and twice the 64-row tiles split half as far ran faster (H100 probe of 2026-12-07: 2112, 1536 and 3072 x 7168
    # and 2304 x 1536 at M = 48 and 64, 0.89-0.98x the 128-row pick's time back to back and after glue; the H200
    # tables hold 64-row tiles in 5 of those 8 cells). Batch-invariant tables keep batch 1's split, so its tiles.
    wide = wide_rule and acts >= WIDE_ACTIVATION_ROWS and not batch_invariant
    rows = HEURISTIC_WEIGHT_ROWS[-1] if math.ceil(n / HEURISTIC_WEIGHT_ROWS[-1]) * most >= target and not wide \
        else HEURISTIC_WEIGHT_ROWS[0]
    tiles = math.ceil(n / rows)
    splits = HEURISTIC_SPLITS if batch_invariant else streaming_splits(tiles, gpu)
    split = next((s for s in splits if s <= most and tiles * s >= target), most)
    # Wide stages took these picks from 1.09x the best timed tactic to 1.06x (H200 tune timings, 2026-12-05: 32 of
    # 32 changed cells faster); under batch invariance they would sum in an order that depends on the batch.
    boxes = 1 if batch_invariant else streaming_boxes(rows, acts, split, k)
    return as_tactic(SplitKTactic(rows, acts, split, max_stages(rows, acts, split, boxes), k_boxes=boxes))


def streaming_splits(tiles: int, gpu: GpuSpec = H200) -> tuple[int, ...]:
    """The streaming rule's splits for ``tiles`` weight tiles: HEURISTIC_SPLITS, and 3 where its grid keeps within
    SPLIT_THREE_FILL of the SMs."""
    # 2112 x 7168 (17 tiles of 128 rows) reaches the CTA target split 3 (51 CTAs) or 4 (68): in the H200 tunes
    # since 2026-12-03 a split-3 tile ran fastest at every M = 16-64 and the split-4 pick 1.10-1.18x behind it,
    # and on the H100 split 3 ran 3-5% faster than 4 at M = 16, 32, 48 and 64. 3072 x 7168 (24 tiles: 72 CTAs split
    # 3) ran 3-6% slower split 3 on the H100 at M = 32 and 64, so it keeps split 4 (96 CTAs); 2304 x 1536 (18 tiles,
    # 54 CTAs) ran within 5% either way on both cards (docs/measurements/2026-12-07-probe-short-k-and-split-3-h100.txt).
    return tuple(sorted({*HEURISTIC_SPLITS, 3})) if 3 * tiles <= SPLIT_THREE_FILL * gpu.sm_count else HEURISTIC_SPLITS


def may_start_dependents_early(tactic: SplitKTactic, gpu: GpuSpec = H200) -> bool:
    """Whether ``tactic`` may let the next launch in as it starts: unclustered, the weight as A, a streaming
    activation tile and one CTA per SM, so that the next launch's CTAs take each SM only as ours leaves it (where
    two CTAs share an SM, the next launch's stream against ours: docs/programmatic-launch.md)."""
    return (tactic.split * tactic.multicast == 1 and not tactic.weight_as_b
            and tactic.activation_rows < COMPUTE_BOUND_ROWS and ctas_per_sm(tactic, gpu) == 1)


def starting_dependents_early(tactic: SplitKTactic, gpu: GpuSpec = H200) -> SplitKTactic:
    """``tactic`` letting the next launch in as it starts, where it may (``may_start_dependents_early``)."""
    # In the tune timings (the geometric mean over launch contexts, as the tuner ranks) the early twin of such a
    # streaming pick ran faster in 110 of 110 H100 cells (2026-12-06: 1.033x the best timed tactic -> 1.008x) and
    # 84 of 85 H200 cells (2026-12-04/05), the early twins of batch-invariant picks faster on average too
    # (docs/measurements/2026-12-06-heuristic-rules-h100.txt), and in the H100 re-tunes of 2026-12-07 (the kernel
    # as it is, the weight's map passed by value) in 344 of 422 timed twin pairs at M <= 64, by 0.5-2%
    # (docs/launch-contexts.md). It does not change the order K is summed in.
    return replace(tactic, dependents_at_start=True) if may_start_dependents_early(tactic, gpu) else tactic


def streaming_boxes(rows: int, acts: int, split: int, k: int) -> int:
    """TMA boxes of K per stage: the most that fit STREAMING_STAGE_BYTES and leave each rank MIN_STAGES loads."""
    return next(boxes for boxes in sorted(K_BOXES, reverse=True)
                if boxes == 1 or (SplitKTactic(rows, acts, split, 1, k_boxes=boxes).stage_bytes <= STREAMING_STAGE_BYTES
                                  and boxes * BOX_K * MIN_STAGES <= k / split))


def filling_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic | None:
    """For streaming batches: one unsplit tile per SM of 32-192 rows (a multiple of 8), or of 16-24 rows from
    MIN_SHORT_FILLING_ACTIVATION_ROWS on where the grid keeps the card's read ceiling times LOADED_LATENCY_US of
    weight in flight (``weight_bytes_in_flight``), else None."""
    # As few rows as put one tile on each SM. In the H200 tune timings of 2026-12-04/05
    # (docs/measurements/*tune-timings*) tiles of 48-160 rows ran 1.03x the best timed tactic where the split rule
    # ran 1.085x (the full tune: 61 of 66 cells faster), and the 32-row tiles of 3584 x 7168 won or tied (10 of 10
    # faster in two files, even in a third).
    # Shorter tiles stream only with enough of them in flight. In the H100 timings (4.0 MB needed) the 16-row tiles
    # of 2112 x 7168 (132 CTAs) at M = 24-48 and the 24-row tiles of 2304 x 1536 and 3072 x 7168 (96 and 128 CTAs)
    # at M = 24-64, 4.1-7.1 MB, ran 1.000-1.030x the best timed tactic where the split rule's picks ran
    # 1.007-1.041x (its 64-row picks at M = 48-64 1.07-1.16x after a kernel in the benchmark); 1536 x 7168's 16-row
    # tiles (96 CTAs, 2.8-3.5 MB) ran 1.07-1.15x. On the H200 (5.7 MB needed) only 3072 x 7168 at M = 24-48
    # qualifies: 1.000-1.038x in four tunes where the split rule's picks ran 1.032-1.065x. At M = 16 the 4-box
    # tiles of 16-24 rows ran 1.07-1.13x on the H100 (docs/measurements/2026-12-07-heuristic-short-filling-tiles.txt).
    if gpu.sm_count < 1:
        return None
    rows = covering_rows(n, gpu.sm_count)
    acts = activation_rows_for(batch)
    short = rows < MIN_FILLING_ROWS
    if (not MIN_SHORT_FILLING_ROWS <= rows <= WEIGHT_ROWS[-1]
            or (short and acts < MIN_SHORT_FILLING_ACTIVATION_ROWS)):
        return None
    boxes = streaming_boxes(rows, acts, 1, k)
    tactic = SplitKTactic(rows, acts, 1, max_stages(rows, acts, 1, boxes), k_boxes=boxes)
    if not tactic.valid or (short and weight_bytes_in_flight(tactic, n, k, batch, gpu)
                            < gpu.hbm_bytes_per_us * LOADED_LATENCY_US):
        return None
    return as_tactic(tactic)


def weight_bytes_in_flight(tactic: SplitKTactic, n: int, k: int, batch: int, gpu: GpuSpec = H200) -> int:
    """Weight bytes the resident CTAs of ``tactic``'s grid have loading at once: each its stages, at most the first
    rank's K tiles, of the weight rows it loads (padding rows are never loaded)."""
    stages = min(tactic.stages, tactic.k_slice(k, rank=0).stages)
    stage_bytes = tactic.fold * tactic.weight_load_rows * tactic.tile_k * 2
    return resident_grid_ctas(tactic, n, batch, gpu) * stages * stage_bytes


def resident_grid_ctas(tactic: SplitKTactic, n: int, batch: int, gpu: GpuSpec = H200) -> int:
    """CTAs of ``tactic``'s grid that ``gpu``'s SMs hold at once."""
    return min(grid_ctas(tactic, n, batch), gpu.sm_count * ctas_per_sm(tactic, gpu))


def folded_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic | None:
    """For streaming batches of a weight of at most 32 rows per SM: one unsplit tile per SM with K folded into its
    warpgroup tile (the most segments that keep MIN_FOLDED_WEIGHT_ROWS weight rows and at most
    MOST_FOLDED_ACTIVATION_ROWS activation rows a stage), else None."""
    # A 64-row shared-memory tile holding one short tile is mostly padding, and splitting K instead pays a cluster
    # reduction; folded, the tile loads fold x its rows of weight a stage and sums its segments in the CTA
    # (docs/padded-and-folded-tiles.md). In the tune timings (H100 2026-12-06, H200 2026-12-04/05) these picks of
    # 1536-3584 rows at M <= 16 ran faster than the split rule's and the 32-row filling tiles in 62 of the 65 cells
    # timed both ways (pick / best 1.050 -> 1.002 on the H100, 1.068 -> 1.020 and 1.094 -> 1.024 on the H200); the
    # three slower are 1536 rows at M = 2-3 on the H200 (up to 1.17x). Past M = 16 the fold's activation slots
    # crowd the stages (the folded tiles the tuner timed at M = 24-64 lost).
    # Stages: 4 boxes at the smallest activation tile, the tuner's first fold candidate (2112 rows' 4-fold: fastest
    # timed in every file); from 16 rows on as wide as STREAMING_STAGE_BYTES allows (2 boxes; 4-box: 1.03-1.06x).
    if gpu.sm_count < 1:
        return None
    acts = activation_rows_for(batch)
    rows = math.ceil(n / gpu.sm_count)
    for fold in sorted(FOLDS[1:], reverse=True):
        if (rows > WGMMA_ROWS // fold or rows * fold < MIN_FOLDED_WEIGHT_ROWS
                or fold * acts > MOST_FOLDED_ACTIVATION_ROWS):
            continue
        for boxes in sorted(K_BOXES, reverse=True):
            tactic = SplitKTactic(rows, acts, 1, max_stages(rows, acts, 1, boxes, fold=fold), k_boxes=boxes, fold=fold)
            wide = boxes > 1 and acts > ACTIVATION_ROWS[0] and tactic.stage_bytes > STREAMING_STAGE_BYTES
            if tactic.valid and tactic.stages >= MIN_STAGES and tactic.k_slice(k, rank=0).stages >= 2 and not wide:
                return as_tactic(tactic)
    return None


def shared_weight_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic | None:
    """For batches of 193-256: pairs of activation tiles sharing each weight tile (the weight as B), else None."""
    # cuBLAS's tiling at M=256: two 128-row activation tiles share each weight tile by multicast (each CTA loads
    # half of its rows), in as few rows (a multiple of 16) as fill the SMs with such pairs in one wave. In the H200
    # tune timings of M=256 (2026-12-04) this pick ran 1.01x the best timed tactic where the one-wave rule ran
    # 1.13-1.17x (20 of 20 cells faster); the 32-row tiles of 2112 and 1536 rows were faster in only 3 of 10
    # cells (tune timings of 2026-12-04/05).
    pairs = SHARED_WEIGHT_PAIRS
    if activation_rows_for(batch) != ACTIVATION_ROWS[-1] or not gpu.clusters_at_once(pairs):
        return None
    rows = covering_rows(n, gpu.clusters_at_once(pairs), multiple=8 * pairs)
    if not MIN_SHARED_WEIGHT_ROWS <= rows <= WEIGHT_ROWS_AS_B[-1]:
        return None
    acts = ACTIVATION_ROWS[-1] // pairs
    tactic = SplitKTactic(rows, acts, 1, max_stages(rows, acts, 1, weight_as_b=True), multicast=pairs, weight_as_b=True)
    return as_tactic(tactic) if tactic.valid and waves(tactic, n, batch, gpu) == 1 else None


def short_k_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic | None:
    """For compute-bound batches of a weight shorter than a pipeline's worth of K tiles: unsplit tiles of
    HEURISTIC_WEIGHT_ROWS over streaming activation tiles (a half or a quarter of the batch's), in the fewest CTAs
    that reach SHORT_K_CTA_FRACTION of the SMs (else the most), letting the next launch in as they start; else
    None."""
    # Each CTA loads its tiles once and writes its output tile: past a third of the SMs more CTAs only re-read the
    # activations and write smaller tiles. In the tune timings of 1536 x 128 and 3072 x 128 at M = 96-256 (H100
    # 2026-12-06, H200 2026-12-03/04) the grid this picks was the best or within 4.4% in every file that timed it,
    # where the fullest one-wave grid (1536 x 128 M=128: 96 CTAs of 64 x 32) ran up to 1.12x the best
    # (docs/measurements/2026-12-07-heuristic-short-k.txt).
    if math.ceil(k / BOX_K) >= MIN_K_TILES_PER_CTA:
        return None
    streaming = [tile for tile in activation_tile_choices(batch) if tile < COMPUTE_BOUND_ROWS]
    options = [o for o, one_wave in grid_options(n, batch, gpu, streaming, [1]) if one_wave]
    if not options:
        return None
    target = math.ceil(SHORT_K_CTA_FRACTION * gpu.sm_count)
    reaching = [o for o in options if o[0] >= target]
    _, acts, _, rows = (min(reaching, key=lambda o: (o[0], -o[3])) if reaching
                        else max(options, key=lambda o: (o[0], o[3])))
    tactic = as_tactic(SplitKTactic(rows, acts, 1, max_stages(rows, acts, 1)))
    return starting_dependents_early(tactic, gpu)


def unsplit_k_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic | None:
    """For compute-bound batches of a weight whose K is too short to split in two (ranks of under
    COVERING_TILE_K_TILES K tiles) and whose 64-row tiles fill under COVERING_TILE_FILL of the SMs: one unsplit
    tile per SM with the weight as B, over an activation tile of exactly the batch's covering rows, else None."""
    # The one-wave rule fills the SMs by splitting K, and short ranks pay the reduction for little work: for 2304 x
    # 1536 (24 K tiles, 36 tiles of 64 rows) at M = 128 and 192 it gives (64, 128-192, 2) shared four ways, which
    # ran 1.17-1.23x the best timed tactic on the H100, where 24-row tiles with the weight as B (96 CTAs) were the best
    # in every H100 tune; on the H200 they ran 1.06-1.09x at M = 128 in six tunes, where the split pick's nearest
    # timed twins ran 1.18-1.33x (docs/measurements/2026-12-07-heuristic-unsplit-k.txt). At M = 96 the weight as
    # B would pad the batch to 128 rows (1.22-1.34x on both cards).
    acts = activation_rows_for(batch)
    if (acts not in ACTIVATION_ROWS_AS_A or math.ceil(k / BOX_K) >= 2 * COVERING_TILE_K_TILES
            or math.ceil(n / WGMMA_ROWS) >= COVERING_TILE_FILL * gpu.sm_count):
        return None
    return tile_per_sm_as_b(n, batch, gpu, multiple=8)


def more_sms_as_b_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic | None:
    """For compute-bound batches: one unsplit tile per SM with the weight as B (``tile_per_sm_as_b``) over exactly
    the batch's covering activation tile, where its tiles hold at least MIN_SHARED_WEIGHT_ROWS rows and run more CTAs
    than the one-wave rule's grid, else None."""
    # The one-wave grid keeps to HEURISTIC_WEIGHT_ROWS tiles, and some weights fit none of them to the SMs: 6288 x
    # 7168 at M = 128-192 takes 50 tiles of 128 rows split 2 (100 CTAs), where 131 tiles of 48 rows as B put every SM
    # to work, unsplit. Those ran the best timed tactic in 5 of 6 H100 tunes (2026-12-06/07; the pick 1.007-1.109x;
    # the full tune's M=192: 1.034x against the pick's 1.007x) and faster than the pick in all 6 H200 cells timed
    # both ways (1.000-1.103x against 1.018-1.252x). Narrower tiles lose as B (2112 x 7168's 16 rows per SM, 132 CTAs
    # against 99: 1.20-1.41x on the H100, 1.37x on the H200), and where one tile per SM runs no more CTAs than the
    # one-wave grid (7168 and 8448 rows: 112 and 132) the grid is kept. At M = 96 the weight as B would pad the batch
    # to 128 rows (6288 x 7168: 1.22-1.53x on both cards).
    tall = tile_per_sm_as_b(n, batch, gpu)
    if (tall is None or tall.activation_rows != activation_rows_for(batch)
            or tall.weight_rows < MIN_SHARED_WEIGHT_ROWS):
        return None
    grid = replace(one_wave_tactic(n, k, batch, gpu), multicast=1)
    return tall if grid_ctas(tall, n, batch) > grid_ctas(grid, n, batch) else None


def one_wave_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic:
    """For compute-bound batches: the fullest grid that fits in one wave, or where that tiles the batch a one-wave
    grid over the whole batch that fills most of the SMs (covering_tile_grid); its neighbouring tiles sharing
    loads."""
    # A second, partly filled wave of MMA-heavy CTAs costs nearly a whole one, and split K beyond need adds
    # reductions of large accumulators: in the H200 timings the best M >= 96 tactics ran 96-132 CTAs with the
    # smallest split that gets there. Ties go to the larger activation tile (the weight is read once per
    # activation tile), then the smaller split, then the larger weight tile. Among timed tactics this rule lost
    # 8% to the best (geometric mean over 59 cells), the fill-the-SMs rule before it 45%.
    splits = [split for split in HEURISTIC_SPLITS if split <= largest_split(k, gpu)]
    options = grid_options(n, batch, gpu, activation_tile_choices(batch), splits)
    fullest = max((o for o, one_wave in options if one_wave), key=fuller(n), default=None)
    covering = covering_tile_grid(n, k, batch, gpu)
    # Only where the fullest grid tiles the batch (and so reads the weight more than once) does the covering grid
    # replace it; a fullest grid over the whole batch keeps its own split, sharing and stages.
    over_the_batch = covering is not None and (fullest is None or fullest[1] < covering.activation_rows)
    if over_the_batch:
        acts, split, rows = covering.activation_rows, covering.split, covering.weight_rows
    elif fullest is not None:
        _, acts, split, rows = fullest
    else:  # no grid fits: one weight-as-B tile per SM, else the fewest CTAs, with the same preferences
        tall = tile_per_sm_as_b(n, batch, gpu)
        if tall is not None:
            return tall
        _, acts, split, rows = min((o for o, _ in options), key=lambda o: (o[0], -o[1], o[2], -o[3]))
    # 64-row tiles in stages as wide as streaming ones (up to STREAMING_STAGE_BYTES: 2 boxes up to 96 activation
    # rows): the twin with 2-box stages ran faster in 11 of 13 H100 cells at M = 96-192 (2304 x 1536 M=96: 1.14x
    # the best timed -> 1.00x) and in 15 of 20 H200 cells timed both ways (six tunes, 2026-12-04/05;
    # docs/measurements/2026-12-06-heuristic-one-wave-rules.txt). Wider tiles were not timed that way.
    # The covering grid keeps one-box stages, the form the tunes timed (2112 x 7168 M=96: the best in 6 of 7 H200
    # tunes; its wide twin never timed).
    boxes = streaming_boxes(rows, acts, split, k) if rows == WGMMA_ROWS and not over_the_batch else 1
    tactic = as_tactic(SplitKTactic(rows, acts, split, max_stages(rows, acts, split, boxes), k_boxes=boxes))
    # Neighbouring weight tiles share each activation load (TMA multicast) where that keeps a grid that runs to
    # its waves and the split is at most 2: in the H200 timings of M = 96-256 four sharers, else two, took the
    # pick from 1.14x the best timed tactic to 1.09x (40 of 52 cells faster in one tune, three more alike;
    # docs/measurements/2026-12-05-heuristic-regret.txt), and with splits of 4 the clusters of 8 lost
    # (1536 x 7168, in two tunes).
    # A shared load saves each K tile's activation reads from L2; with fewer K tiles than a pipeline's worth the
    # cluster costs more than that: 1536 x 128 and 3072 x 128 at M = 96-256 ran 1.08-1.09x the best timed tactic
    # shared, 1.05-1.06x unshared (14 of 14 cells faster; tune timings, H100 2026-12-06 and H200 2026-12-04).
    unshared_waves = waves(tactic, n, batch, gpu)
    if (tactic.split > MOST_SHARING_SPLIT or not math.isfinite(unshared_waves)
            or math.ceil(k / BOX_K) < MIN_K_TILES_PER_CTA):
        return in_column_groups(tactic)
    for sharers in ACTIVATION_SHARERS:
        shared = replace(tactic, multicast=sharers)
        if shared.valid and waves(shared, n, batch, gpu) == unshared_waves:
            return in_column_groups(shared)
    return in_column_groups(tactic)


def covering_tile_grid(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic | None:
    """For compute-bound batches: the one-wave grid with the batch in one activation tile that fills
    COVERING_TILE_FILL of the SMs (the most CTAs, then the smaller split, then the larger weight tile), its
    ranks keeping COVERING_TILE_K_TILES K tiles each, else None. Its stages are one_wave_tactic's to set."""
    # The fullest grid may tile the batch, and so read the weight once per activation tile: 2112 x 7168 at
    # M = 96-128 took two tiles of 48-64 rows (132 CTAs) and ran 1.12-1.26x the best timed tactic on both cards,
    # where 33 tiles of 64 rows split 3 over the whole batch (99 CTAs) was the best or within 7% in every tune
    # that timed it.
    # With 8 K tiles a rank (2304 x 1536 split 3) the same grid ran 1.18-1.38x on the H200
    # (docs/measurements/2026-12-07-heuristic-covering-tile.txt).
    covering = activation_rows_for(batch)
    if covering < batch:  # past the largest activation tile, no tile covers the batch
        return None
    k_tiles = math.ceil(k / BOX_K)
    splits = [split for split in COVERING_TILE_SPLITS
              if split <= largest_split(k, gpu) and k_tiles >= split * COVERING_TILE_K_TILES]
    filling = [o for o, one_wave in grid_options(n, batch, gpu, [covering], splits)
               if one_wave and o[0] >= COVERING_TILE_FILL * gpu.sm_count]
    if not filling:
        return None
    _, acts, split, rows = max(filling, key=fuller(n))
    return SplitKTactic(rows, acts, split, 2)


def grid_options(n: int, batch: int, gpu: GpuSpec, activation_tiles, splits) -> list:
    """``[((CTAs, activation rows, split, weight rows), whether it fits in one wave)]`` for the grids of
    HEURISTIC_WEIGHT_ROWS tiles over each of ``activation_tiles`` in each of ``splits``."""
    grids = [SplitKTactic(rows, acts, split, 2)
             for acts in activation_tiles for rows in HEURISTIC_WEIGHT_ROWS for split in splits]
    return [((grid_ctas(t, n, batch), t.activation_rows, t.split, t.weight_rows), waves(t, n, batch, gpu) == 1)
            for t in grids]


def fuller(n: int):
    """The one-wave rules' preference among grid_options: more CTAs, then the larger activation tile, then the
    smaller split, then a weight tile no taller than the weight's ``n`` rows, then the larger one."""
    return lambda o: (o[0], o[1], -o[2], o[3] <= n, o[3])


def in_column_groups(tactic: SplitKTactic) -> SplitKTactic:
    """``tactic`` with two consumer warpgroups, each over half of its activation columns, where it may have them (64
    weight rows as A, 128 or more activation rows)."""
    # One warpgroup issues every wgmma of a 64-row tile; two run the halves of the batch side by side. The tuner
    # times a pick beside its twin in the other count of column groups: the two-group twin of one-group picks ran
    # faster in 20 of 22 H100 cells at M = 128-256 (2026-12-06; 1536 x 7168 M=256: 1.11x the best timed -> 1.00x)
    # and in all 20 H200 cells timed both ways (4 cells in 5 tunes, 2026-12-04/05;
    # docs/measurements/2026-12-06-heuristic-one-wave-rules.txt).
    grouped = replace(tactic, column_groups=2)
    return grouped if grouped.valid else tactic


def tile_per_sm_as_b(n: int, batch: int, gpu: GpuSpec = H200, *, multiple: int = 16) -> SplitKTactic | None:
    """For compute-bound batches of a weight too tall for a one-wave grid of HEURISTIC_WEIGHT_ROWS tiles: one
    unsplit tile per SM with the weight as B (rows a multiple of ``multiple``), the batch in one activation tile,
    else None."""
    # As the filling tiles stream: in the tune timings 20480 x 7168 at M = 96-256 ran (160, 128-256, B) 1.00-1.02x
    # the best timed tactic where the fewest CTAs of 128-row tiles ran 1.09-1.46x (6 of 6 cells faster where
    # timed, H100 2026-12-06 and H200 2026-12-04; the H200 table's tune of 2026-12-05 chose the same tiles).
    # A multiple of 16 rows for tall weights: halves of it are wgmma's N where registers are reallocated.
    if gpu.sm_count < 1:
        return None
    acts = next((rows for rows in ACTIVATION_ROWS_AS_A if rows >= batch), ACTIVATION_ROWS_AS_A[-1])
    rows = covering_rows(n, gpu.sm_count, multiple=multiple)
    if rows not in WEIGHT_ROWS_AS_B:
        return None
    tactic = SplitKTactic(rows, acts, 1, max_stages(rows, acts, 1, weight_as_b=True), weight_as_b=True)
    return as_tactic(tactic) if tactic.valid and waves(tactic, n, batch, gpu) == 1 else None


def pinned_tactic(n: int, k: int, batch: int, order, gpu: GpuSpec = H200) -> SplitKTactic:
    """The heuristic's tactic with the summation order ``order`` = (split, k boxes)."""
    # Wide stages may not fit a large activation tile with the usual weight rows: then the other weight tile,
    # else a smaller activation tile (the batch is tiled, and the weight read once per tile).
    if len(order) != 2:
        raise ValueError(f"summation order {order} is not (split, k boxes) with the weight as A: "
                         "batch invariance is verified with the weight as A only")
    split, k_boxes = order
    usual = default_tactic(n, k, 1, gpu, batch_invariant=True).weight_rows
    rows_first = [usual] + [rows for rows in WEIGHT_ROWS if rows != usual]
    tiles = [tile for tile in sorted(ACTIVATION_ROWS, reverse=True) if tile <= activation_rows_for(batch)]
    options = [
        SplitKTactic(rows, tile, split, max_stages(rows, tile, split, k_boxes), k_boxes=k_boxes)
        for tile in tiles for rows in rows_first
    ]
    valid = [t for t in options if t.valid]
    if not valid:
        raise ValueError(f"no tactic sums in the order (split {split}, k boxes {k_boxes}) for {n}x{k} M={batch}")
    return next((t for t in valid if t.stages >= MIN_STAGES), valid[0])


def stages_sharing_an_sm(rows: int, acts: int, split: int, k_boxes: int = 1, *, per_sm: int = 1,
                         gpu: GpuSpec = H200, fold: int = 1) -> int:
    """The deepest pipeline of (weight) ``rows``, ``acts`` activation rows, ``split``, ``k_boxes`` and ``fold`` that
    fits in shared memory and lets ``per_sm`` CTAs share an SM of ``gpu`` (the weight as A, its reduction not
    buffered)."""
    budget = gpu.smem_per_sm // per_sm - RESERVED_SMEM_PER_CTA - BARRIER_BYTES
    probe = SplitKTactic(rows, acts, split, 1, k_boxes=k_boxes, fold=fold)
    return min(max_stages(rows, acts, split, k_boxes, fold=fold), budget // probe.stage_bytes)


def ctas_per_sm(tactic: SplitKTactic, gpu: GpuSpec = H200) -> int:
    """How many CTAs of ``tactic`` shared memory lets one SM hold at once."""
    return resident_ctas(tactic.smem_bytes, gpu.smem_per_sm)


def predicted_time_us(n: int, k: int, batch: int, tactic: SplitKTactic, gpu: GpuSpec = H200) -> float:
    """A rough time for ranking tactics before timing them (not a promise)."""
    # Bandwidth is limited by the bytes the resident CTAs keep in flight over the loaded memory latency, by
    # what the SMs holding CTAs can pull each, and by the HBM ceiling; the tensor cores of those SMs bound
    # compute-heavy batches; activation tiles are re-read from L2 by every CTA; each extra wave and each
    # split-K reduction adds a fixed cost. The constants were fitted to the 2,070 candidates the H200 tuner
    # timed (docs/measurements/*tune-timings*): ranked by this model, the pick among them is 9% slower than
    # the best on average, against 17% with the earlier hand-set constants.
    l2_bytes_per_us, launch_us, wave_us, reduce_us = 18e6, 2.0, 2.2, 1.9
    n_tiles = math.ceil(n / tactic.weight_rows)
    m_tiles = math.ceil(batch / tactic.activation_rows)
    ctas = grid_ctas(tactic, n, batch)
    per_sm = ctas_per_sm(tactic, gpu)
    # Padding rows are never loaded.
    in_flight = resident_grid_ctas(tactic, n, batch, gpu) * tactic.stages * tactic.stage_load_bytes
    bandwidth = min(gpu.hbm_bytes_per_us, in_flight / LOADED_LATENCY_US, min(ctas, gpu.sm_count) * SM_BYTES_PER_US)
    weight_us = m_tiles * n * k * 2 / bandwidth
    # Every CTA reads its K slice of the activation tile: per weight tile, all of K.
    act_us = n_tiles * m_tiles * tactic.activation_rows * k * 2 / l2_bytes_per_us
    # The busiest SM runs one CTA's MMAs per wave of one CTA per SM, one wave after another.
    cta_flops = 2 * math.prod(tactic.tile_mnk) * tactic.k_slice(k, rank=0).stages
    compute_us = waves(tactic, n, batch, gpu) * cta_flops / SM_FLOPS_PER_US
    extra_waves = waves(tactic, n, batch, gpu, per_sm) - 1
    reduction = reduce_us if tactic.split > 1 else 0.0
    return launch_us + max(weight_us, compute_us) + act_us + extra_waves * wave_us + reduction


def activation_tile_choices(batch: int) -> list[int]:
    """Activation tiles worth timing: the covering one, and from compute-bound batches on
    also a half and a quarter of it (more CTAs for the tensor cores, at the price of
    reading the weight once per activation tile)."""
    covering = activation_rows_for(batch)
    if covering < COMPUTE_BOUND_ROWS:
        return [covering]
    return [tile for tile in (covering, covering // 2, covering // 4) if tile in ACTIVATION_ROWS]


def grid_ctas(tactic: SplitKTactic, n: int, batch: int) -> int:
    """CTAs of ``tactic``'s grid, the tiles that share loads rounded up to whole multicast groups."""
    return tactic.grid_columns(n) * tactic.grid_rows(batch)


def waves(tactic: SplitKTactic, n: int, batch: int, gpu: GpuSpec = H200, per_sm: int = 1) -> float:
    """Waves ``tactic``'s grid takes with ``per_sm`` CTAs per SM, counted in whole clusters (inf: none fits)."""
    size = tactic.split * tactic.multicast
    clusters = grid_ctas(tactic, n, batch) // size
    slots = gpu.clusters_at_once(size) * per_sm
    # A GPU with fewer SMs than the cluster has CTAs (or a measured residency of 0) never runs such a grid.
    return math.ceil(clusters / slots) if slots else math.inf


def resolve_policies(n, k, batches, *, gpu: GpuSpec, weight_dtype, output_dtype, batch_invariant=False,
                     use_tables=True):
    """``({batch: tactic}, {batch: "table" | "heuristic"})``: tuned entries where a table matches."""
    batches = tuple(batches)  # read three times below: a generator would be spent after the first
    tuned, order = {}, None
    if use_tables:
        key = TableKey.for_cell(gpu, n, k, weight_dtype=weight_dtype, output_dtype=output_dtype,
                                batch_invariant=batch_invariant)
        tuned = table_policies(key, batches)
        # A batch-invariant table fixes the summation order for every batch, covered or not.
        order = table_summation_order(key)
    guessed = {
        b: default_tactic(n, k, b, gpu, batch_invariant=batch_invariant, order=order)
        for b in batches
        if b not in tuned
    }
    return {**guessed, **tuned}, {b: "table" if b in tuned else "heuristic" for b in batches}


# A gated tile split in two reduces vectors of 4 accumulators (a gate pair and its up pair: gated_problems) only
# from 16 activation rows on; rows past the batch are zero-filled by TMA, not read.
GATED_SPLIT_ACTIVATION_ROWS = 16
# K boxes per stage of such a tile: 3072 x 7168's (48,16,2) tiles at M = 1 took 14.87 / 16.22 us back to back /
# after glue in 2-box stages, 15.21 / 16.59 in 4-box ones (H100,
# docs/measurements/2026-12-07-probe-gated-split-h100.txt).
GATED_SPLIT_BOXES = (2, 1)


class GatedForm(NamedTuple):
    """A tile ``gated_tactic`` tries: its weight and activation rows, fold, and the splits and K boxes per stage
    tried in turn."""

    rows: int
    acts: int
    fold: int
    splits: tuple
    boxes: tuple


def gated_tactic(tactic: SplitKTactic, n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic:
    """``tactic`` where it can run a gated projection of an interleaved weight of ``n`` x ``k`` at ``batch``
    (kernel.tactic.gated_problems), else the nearest that can: the weight as A, its tile rounded up to whole 16-row
    gate groups (a streaming folded tile keeps its fold: its slot of 32 or 16 rows holds the rounded tile), its
    activation tile and K boxes kept where they fit, as many stages as fit, and letting the next launch in as it
    starts where ``tactic`` did and the nearest may (``may_start_dependents_early``). An unsplit streaming tile of
    an odd number of 8-row halves first tries twice its rows with K split in two, over at least
    GATED_SPLIT_ACTIVATION_ROWS, where that grid has more CTAs than the rounded one's, fits one wave and leaves each
    rank two stages of K: as many CTAs as ``tactic`` (3072 rows in 24-row tiles: 128, rounded up 96).
    A weight-as-B tactic that cannot gate becomes 64-row tiles over one activation tile as tall as the tiles that
    shared each of its weight loads, so the weight is still read once; a compute-bound nearest is unfolded and
    splits K as far as its grid still fits one wave, the tensor cores of every SM then working on the batch."""
    # The early start is worth keeping: on the H100, 3072 x 7168's 32-row gated tiles at M = 1 and 8 took 15.0-15.3
    # us back to back with it and 16.2-16.3 without, the same after glue. Its 24-row tiles (128 CTAs) rounded up to
    # 32 rows (96) ran 0.6-0.9 us over the plain projection after glue at M = 1-16; as 48-row tiles split in two,
    # within 0.15 us of it after glue (M = 16: faster), and 0.2-0.8 us slower back to back (docs/epilogues.md).
    if not gated_problems(tactic):
        return tactic
    if tactic.weight_as_b:
        shared = tactic.activation_rows * tactic.weight_sharers
        acts = next((a for a in ACTIVATION_ROWS if a >= shared), ACTIVATION_ROWS[-1])
        rows = WGMMA_ROWS
    else:
        acts = tactic.activation_rows
        rows = min(math.ceil(tactic.weight_rows / GATE_GROUP_ROWS) * GATE_GROUP_ROWS, WEIGHT_ROWS[-1])
    splits = HEURISTIC_SPLITS[::-1] if acts >= COMPUTE_BOUND_ROWS else (1,)
    rounded = GatedForm(rows, acts, tactic.fold if splits == (1,) else 1, splits,  # a fold takes no split
                        tuple(dict.fromkeys((tactic.k_boxes, 1))))
    forms = [rounded]
    if (not tactic.weight_as_b and tactic.split == 1 and acts < COMPUTE_BOUND_ROWS
            and tactic.weight_rows % GATE_GROUP_ROWS == GATE_GROUP_ROWS // 2):
        paired = GatedForm(2 * tactic.weight_rows, max(acts, GATED_SPLIT_ACTIVATION_ROWS), 1, (2,), GATED_SPLIT_BOXES)
        if (grid_ctas(SplitKTactic(paired.rows, paired.acts, 2, 2), n, batch)
                > grid_ctas(SplitKTactic(rounded.rows, rounded.acts, 1, 2), n, batch)):
            forms.insert(0, paired)
    for form in forms:
        for split, boxes in itertools.product(form.splits, form.boxes):
            nearest = SplitKTactic(form.rows, form.acts, split,
                                   max_stages(form.rows, form.acts, split, boxes, fold=form.fold), k_boxes=boxes,
                                   fold=form.fold)
            # Two stages leave one in flight: a split tile must keep the pipeline as deep as the heuristic's, and
            # each rank two stages of K.
            if nearest.valid and not gated_problems(nearest) and (split == 1 or (
                    nearest.stages >= MIN_STAGES and waves(nearest, n, batch, gpu) == 1
                    and nearest.k_slice(k, rank=0).stages >= 2)):
                return as_tactic(starting_dependents_early(nearest, gpu) if tactic.dependents_at_start else nearest)
    raise ValueError(f"no gated tactic near {tactic}")


def gated_candidates(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> list[SplitKTactic]:
    """Every tactic worth timing for a gated projection of an interleaved weight of ``n`` rows (twice the gate rows)
    at ``batch``, by predicted time: tiles of each whole number of 16-row gate groups (kernel.tactic.gated_problems)
    over the covering activation tile, unfolded and folded where they fit a fold's slot, or split in two over at
    least GATED_SPLIT_ACTIVATION_ROWS where one wave holds them, in 1-, 2- and 4-box stages, as deep as fit and,
    where the grid has more CTAs than ``gpu`` has SMs, as deep as let two CTAs share an SM (3072 rows in 16-row
    tiles: 192 CTAs in one wave on 132 SMs); those alone on an SM also letting the next launch in as they start
    (``may_start_dependents_early``)."""
    # gated_tactic maps the table's pick to the nearest tile that can gate: these are for timing to choose among.
    found = []
    covering = activation_rows_for(batch)
    forms = [(1, fold) for fold in FOLDS] + [(2, 1)]  # (split, fold): a fold takes no split
    for rows, (split, fold) in itertools.product(
            [rows for rows in WEIGHT_ROWS_AS_A if rows % GATE_GROUP_ROWS == 0], forms):
        acts = covering if split == 1 else max(covering, GATED_SPLIT_ACTIVATION_ROWS)
        # Where every CTA has an SM anyway, room for two only costs stages (a split grid keeps to one wave anyway).
        sharing = (1, 2) if split == 1 and grid_ctas(SplitKTactic(rows, acts, 1, 2), n, batch) > gpu.sm_count else (1,)
        for boxes in K_BOXES:
            for per_sm in sharing:
                stages = stages_sharing_an_sm(rows, acts, split, boxes, per_sm=per_sm, gpu=gpu, fold=fold)
                tactic = SplitKTactic(rows, acts, split, stages, k_boxes=boxes, fold=fold)
                # Two stages leave one in flight (2 of 4 boxes ran 3x slower: tuning.candidates.folded_tactics), and
                # stages wider than half of K (of each folded segment or rank) no pipeline (one-box stages are K's
                # narrowest); a split grid past one wave waits for its clusters.
                if (tactic.valid and not gated_problems(tactic) and tactic.stages >= MIN_STAGES
                        and (boxes == 1 and fold == 1 and split == 1 or tactic.k_slice(k, rank=0).stages >= 2)
                        and (split == 1 or waves(tactic, n, batch, gpu) == 1)):
                    found.append(tactic)
    found += [replace(t, dependents_at_start=True) for t in found if may_start_dependents_early(t, gpu)]
    unique = set(found)  # where room for one CTA already leaves room for two, both depths are one tactic
    return sorted(unique, key=lambda t: (predicted_time_us(n, k, batch, t, gpu), -t.stages * t.k_boxes, t.label))
