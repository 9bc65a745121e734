"""Tactic choice without tuning: a heuristic and the cost model the tuner prunes with.

At decode the projection streams the weight once, so what matters is keeping
enough bytes in flight across the GPU to reach HBM bandwidth, without so many
CTAs that split-K reductions and re-read activations cost more than they hide.
Measured on an H200 (docs/performance.md): the deepest pipeline that fits wins,
and about 0.4 CTAs per SM already saturate HBM when each keeps ~200 KB in
flight; past that, extra split only adds reduction work. Compute-bound batches
(activation tiles of 96 or more) want the fullest grid that fits in one wave.
"""

import functools
import math
import sys
from dataclasses import dataclass, replace

import torch

from .tables import TableKey, dtype_name, table_policies, table_summation_order
from .tactic import (
    ACTIVATION_ROWS, ACTIVATION_ROWS_AS_A, BARRIER_BYTES, BOX_K, FOLDS, K_BOXES, MULTICASTS, PORTABLE_CLUSTER, SPLITS,
    WEIGHT_ROWS, WEIGHT_ROWS_AS_A, WEIGHT_ROWS_AS_B, WGMMA_ROWS, SplitKTactic, as_tactic, max_stages,
)

MIN_K_TILES_PER_CTA = 4  # fewer and the pipeline never fills
HEURISTIC_SPLITS = (1, 2, 4, 8)  # the no-table rule keeps to the splits it was measured with
HEURISTIC_WEIGHT_ROWS = (64, 128)  # and to the weight tiles it was measured with (192 is the tuner's to try)
STREAMING_CTA_FRACTION = 0.375  # CTAs per SM that saturate HBM with deep pipelines
COMPUTE_BOUND_ROWS = 96  # activation tiles from here on are bound by the tensor cores
MIN_STAGES = 3  # one-box stages: shallower pipelines never won a sweep (wide stages may go to 2)
WIDE_STAGE_CANDIDATES = 4  # slots for 2- and 4-box variants of the best one-box tactics
SHARED_LOAD_CANDIDATES = 2  # slots for the best tactic with its activations multicast to 2 and 4 tiles
SHARED_LOAD_ROWS = 32  # activation tiles from here on cost enough L2 traffic to share
COLUMN_GROUP_CANDIDATES = 2  # slots for the best 64-row tactics with two warpgroups splitting the activations
WEIGHT_AS_B_CANDIDATES = 4  # slots for the best tactics with the weight as wgmma's B, sized to fill the SMs
PADDED_TILE_CANDIDATES = 3  # slots for SM-filling weight-as-A tiles padded to whole warpgroups (padded_tile_tactics)
FOLDED_CANDIDATES = 2  # slots for SM-filling tiles with K folded into one warpgroup tile (folded_tactics)
# From these activation rows on the weight as B is worth timing: at M=64 its SM-filling tiles beat every
# weight-as-A tactic on the largest weights by 3-4% (6288 x 7168: 48 x 64 tiles, 131 CTAs; 20480 x 7168:
# 160 x 64, 128 CTAs), where 64 activation rows do 64 FLOP per weight byte (docs/performance.md, v17).
WEIGHT_AS_B_ROWS = 32
# Unclustered tactics with an SM to themselves and streaming tiles (fewer than COMPUTE_BOUND_ROWS activation rows)
# are also timed letting the next launch in as they start (SplitKTactic.dependents_at_start). On the H200 that won
# 0.95 us back to back with 8-16 activation rows and 0.75 us with staged tiles (medians of 211 and 124 pairs) on
# weights of 40 MB and more, and lost up to 7 us on some (docs/performance.md, v22); where two or more CTAs fit on
# an SM it lost 2-24 us there (v21). Timing decides, for this many.
EARLY_DEPENDENTS_CANDIDATES = 3
MOST_CTAS_PER_SM = 6  # enough for a 64-row, split-2 grid of the largest shape to fit in one wave
RESERVED_SMEM_PER_CTA = 1024  # what the driver keeps per resident CTA on sm_90
SM_FLOPS_PER_US = 5.1e6  # dense BF16 wgmma per SM as fitted, ~70% of the datasheet 989 TFLOPS / 132
SM_BYTES_PER_US = 50e3  # HBM bytes one SM pulls at most, as fitted (~50 GB/s: 132 SMs reach 6.6 TB/s)


@dataclass(frozen=True)
class GpuSpec:
    """What the heuristic needs to know about a GPU."""

    name: str
    sm_count: int
    smem_per_sm: int
    hbm_bytes_per_us: float  # streaming-read ceiling: the H200's measured one for every GPU (gpu_spec)
    # Clusters of 1, 2, ... CTAs resident at once, one CTA per SM (scripts/cluster_residency.py):
    # a cluster's CTAs share a GPC, so fewer fit than SMs / size. Unmeasured: SMs / size.
    cluster_slots: tuple[int, ...] = ()

    def clusters_at_once(self, size: int) -> int:
        """How many clusters of ``size`` CTAs run at once with one CTA per SM."""
        return self.cluster_slots[size - 1] if size <= len(self.cluster_slots) else self.sm_count // size


# Cluster residency measured on the H200 (2026-12-02, scripts/cluster_residency.py): only 30
# clusters of 4 fit at once (120 CTAs), 39 of 3, 15 of 8.
H200 = GpuSpec("NVIDIA H200", 132, 228 * 1024, 4.4e6, (132, 66, 39, 30, 22, 17, 15, 15))


def gpu_spec(device=None, *, measure_clusters=False) -> GpuSpec:
    """The spec of ``device``'s GPU, or the H200's when no device is given.

    Cluster residency is the H200's where the GPU is one, else SMs / size, unless
    ``measure_clusters`` asks the driver (compiles a probe kernel: for the tuner).
    """
    if device is None:
        return H200
    props = torch.cuda.get_device_properties(device)
    smem = getattr(props, "shared_memory_per_multiprocessor", H200.smem_per_sm)
    same = (props.name, props.multi_processor_count) == (H200.name, H200.sm_count)
    slots = measured_cluster_slots(device_index(device)) if measure_clusters else H200.cluster_slots if same else ()
    return GpuSpec(props.name, props.multi_processor_count, smem, H200.hbm_bytes_per_us, slots)


def device_index(device) -> int:
    """The CUDA ordinal of ``device`` (an int, a string or a torch.device; no index: the current one)."""
    found = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return torch.cuda.current_device() if found.index is None else found.index


@functools.cache
def measured_cluster_slots(index: int) -> tuple[int, ...]:
    """Clusters of 1..PORTABLE_CLUSTER CTAs the driver says fit at once, one CTA per SM."""
    import cutlass.utils

    with torch.cuda.device(index):
        torch.empty(1, device="cuda")  # the driver query runs in the current (torch's primary) context
        try:
            info = cutlass.utils.HardwareInfo(index)
            return tuple(info.get_max_active_clusters(size) for size in range(1, PORTABLE_CLUSTER + 1))
        except RuntimeError as error:
            print(f"cluster residency not measured ({error}): assuming SMs / cluster size", file=sys.stderr)
            return ()


def activation_rows_for(batch: int) -> int:
    """The smallest legal activation tile covering ``batch`` (256 for larger batches)."""
    return next((rows for rows in ACTIVATION_ROWS if rows >= batch), ACTIVATION_ROWS[-1])


def largest_split(k: int) -> int:
    """The largest of HEURISTIC_SPLITS that still gives each CTA a pipeline's worth of K tiles
    (also the tuner's cap: odd splits in between, not past it)."""
    k_tiles = math.ceil(k / BOX_K)
    fitting = [s for s in HEURISTIC_SPLITS if k_tiles >= s * MIN_K_TILES_PER_CTA]
    return max(fitting, default=1)


def default_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200, *, batch_invariant=False, order=None):
    """The heuristic's tactic for one padded batch.

    With ``batch_invariant`` the split (and so the order K is summed in) is the
    one batch 1 gets, so a row's result never depends on the batch it is in;
    ``order`` = (split, k boxes) pins it instead (to match a tuned batch-invariant table).
    """
    acts = activation_rows_for(batch)
    if order is not None:
        return pinned_tactic(n, k, batch, order, gpu)
    if acts >= COMPUTE_BOUND_ROWS and not batch_invariant:
        return one_wave_tactic(n, k, batch, gpu)
    # Streaming batches, and batch-invariant tables at every batch (they keep batch 1's split).
    target = math.ceil(STREAMING_CTA_FRACTION * gpu.sm_count)
    most = largest_split(k)
    rows = HEURISTIC_WEIGHT_ROWS[-1] if math.ceil(n / HEURISTIC_WEIGHT_ROWS[-1]) * most >= target \
        else HEURISTIC_WEIGHT_ROWS[0]
    tiles = math.ceil(n / rows)
    split = next((s for s in HEURISTIC_SPLITS if s <= most and tiles * s >= target), most)
    return as_tactic(SplitKTactic(rows, acts, split, max_stages(rows, acts, split)))


def one_wave_tactic(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> SplitKTactic:
    """For compute-bound batches: the grid with the most CTAs that still fits in one wave
    (of whole clusters: a split of 4 fits fewer CTAs at once than SMs).

    A second, partly filled wave of MMA-heavy CTAs costs nearly a whole one, and
    split K beyond need adds reductions of large accumulators: in the H200
    timings the best M >= 96 tactics ran 96-132 CTAs with the smallest split
    that gets there. Ties go to the larger activation tile (the weight is read
    once per activation tile), then the smaller split, then the larger weight
    tile. Among timed tactics this rule lost 8% to the best (geometric mean over
    59 cells), the fill-the-SMs rule before it 45%.
    """
    grids = [
        SplitKTactic(rows, acts, split, 2)
        for acts in activation_tile_choices(batch)
        for rows in HEURISTIC_WEIGHT_ROWS
        for split in HEURISTIC_SPLITS
        if split <= largest_split(k)
    ]
    options = [(grid_ctas(t, n, batch), t.activation_rows, t.split, t.weight_rows) for t in grids]
    one_wave = [o for t, o in zip(grids, options) if waves(t, n, batch, gpu) == 1]
    if one_wave:
        _, acts, split, rows = max(one_wave, key=lambda o: (o[0], o[1], -o[2], o[3] <= n, o[3]))
    else:  # no grid fits: the fewest CTAs, with the same preferences
        _, acts, split, rows = min(options, key=lambda o: (o[0], -o[1], o[2], -o[3]))
    return as_tactic(SplitKTactic(rows, acts, split, max_stages(rows, acts, split)))


def pinned_tactic(n: int, k: int, batch: int, order, gpu: GpuSpec = H200) -> SplitKTactic:
    """The heuristic's tactic with the summation order ``order`` = (split, k boxes).

    Wide stages may not fit a large activation tile with the usual weight rows:
    then the other weight tile, else a smaller activation tile (the batch is
    tiled, and the weight read once per tile).
    """
    if len(order) != 2:
        raise ValueError(f"summation order {order} is not (split, k boxes) with the weight as A: "
                         "batch invariance is verified with the weight as A only")
    split, k_boxes = order
    usual = default_tactic(n, k, 1, gpu, batch_invariant=True).weight_rows
    rows_first = [usual] + [rows for rows in WEIGHT_ROWS if rows != usual]
    tiles = [tile for tile in sorted(ACTIVATION_ROWS, reverse=True) if tile <= activation_rows_for(batch)]
    options = [
        SplitKTactic(rows, tile, split, max_stages(rows, tile, split, k_boxes), k_boxes)
        for tile in tiles for rows in rows_first
    ]
    valid = [t for t in options if t.valid]
    if not valid:
        raise ValueError(f"no tactic sums in the order (split {split}, k boxes {k_boxes}) for {n}x{k} M={batch}")
    return next((t for t in valid if t.stages >= MIN_STAGES), valid[0])


def ctas_per_sm(tactic: SplitKTactic, gpu: GpuSpec = H200) -> int:
    """How many CTAs of ``tactic`` shared memory lets one SM hold at once."""
    return max(1, gpu.smem_per_sm // (tactic.smem_bytes + RESERVED_SMEM_PER_CTA))


def predicted_time_us(n: int, k: int, batch: int, tactic: SplitKTactic, gpu: GpuSpec = H200) -> float:
    """A rough time for ranking tactics before timing them (not a promise).

    Bandwidth is limited by the bytes the resident CTAs keep in flight over the
    loaded memory latency, by what the SMs holding CTAs can pull each, and by
    the HBM ceiling; the tensor cores of those SMs bound compute-heavy batches;
    activation tiles are re-read from L2 by every CTA; each extra wave and each
    split-K reduction adds a fixed cost. The constants were fitted to the 2,070
    candidates the H200 tuner timed (docs/measurements/*tune-timings*): ranked
    by this model, the pick among them is 9% slower than the best on average,
    against 17% with the earlier hand-set constants.
    """
    latency_us, l2_bytes_per_us, launch_us, wave_us, reduce_us = 1.3, 18e6, 2.0, 2.2, 1.9
    n_tiles = math.ceil(n / tactic.weight_rows)
    m_tiles = math.ceil(batch / tactic.activation_rows)
    ctas = grid_ctas(tactic, n, batch)
    per_sm = ctas_per_sm(tactic, gpu)
    resident = min(ctas, gpu.sm_count * per_sm)
    in_flight = resident * tactic.stages * tactic.stage_load_bytes  # padding rows are never loaded
    bandwidth = min(gpu.hbm_bytes_per_us, in_flight / latency_us, min(ctas, gpu.sm_count) * SM_BYTES_PER_US)
    weight_us = m_tiles * n * k * 2 / bandwidth
    # Every CTA reads its K slice of the activation tile: per weight tile, all of K.
    act_us = n_tiles * m_tiles * tactic.activation_rows * k * 2 / l2_bytes_per_us
    # The busiest SM runs one CTA's MMAs per wave of one CTA per SM, one wave after another.
    k_tiles_per_cta = math.ceil(math.ceil(k / tactic.tile_k) / (tactic.split * tactic.fold))
    cta_flops = 2 * math.prod(tactic.tile_mnk) * k_tiles_per_cta
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


def pool_tactics(batch, k, gpu: GpuSpec = H200, *, order=None):
    """Every tactic worth timing for one batch: each tile and split, at the deepest
    pipeline that lets 1 to MOST_CTAS_PER_SM CTAs share an SM (so a grid can fit in one wave).

    One box per stage unless ``order`` = (split, k boxes) pins both.
    """
    splits = [order[0]] if order is not None else [s for s in SPLITS if s <= largest_split(k)]
    k_boxes = order[1] if order is not None else 1
    pool = set()
    for acts in activation_tile_choices(batch):
        # Three warpgroups only pay where the tensor cores bound the time.
        for rows in [r for r in WEIGHT_ROWS if r in HEURISTIC_WEIGHT_ROWS or acts >= COMPUTE_BOUND_ROWS]:
            for s in splits:
                for resident in range(1, MOST_CTAS_PER_SM + 1):
                    probe = SplitKTactic(rows, acts, s, 1, k_boxes)
                    budget = gpu.smem_per_sm // resident - RESERVED_SMEM_PER_CTA - BARRIER_BYTES
                    stages = min(max_stages(rows, acts, s, k_boxes), budget // probe.stage_bytes)
                    tactic = SplitKTactic(rows, acts, s, stages, k_boxes)
                    if stages >= MIN_STAGES and tactic.valid:
                        pool.add(tactic)
    return pool


def filling_tactics(n: int, k: int, batch: int, gpu: GpuSpec = H200, *, weight_as_b: bool) -> list[SplitKTactic]:
    """Tactics whose weight tiles are sized to fill the SMs: for each activation tile and split,
    the narrowest tile of a multiple of 8 rows whose grid of whole clusters fits in the fewest
    waves, at the deepest pipeline. The best predicted without split K and with it come first
    (the model has not been fitted to these tactics), then the rest by prediction.

    64-row weight tiles leave SMs idle where N / 64 tiles do not divide the SMs (7168 rows fill
    112 of 132); a tile of any multiple of 8 rows can fill them (128 tiles of 56). With the
    weight as B the activations are wgmma's A, one or two 64-row tiles; with the weight as A
    its tile is padded to whole warpgroups in shared memory (``SplitKTactic.weight_smem_rows``).
    """
    found = []
    if weight_as_b:
        # At streaming batches one 64-row tile covers the batch; a wider one would only add zero rows.
        compute_bound = activation_rows_for(batch) >= COMPUTE_BOUND_ROWS
        activation_tiles = ACTIVATION_ROWS_AS_A if compute_bound else ACTIVATION_ROWS_AS_A[:1]
        most_rows = WEIGHT_ROWS_AS_B[-1]
    else:
        activation_tiles, most_rows = [activation_rows_for(batch)], WEIGHT_ROWS_AS_A[-1]
    for acts in activation_tiles:
        m_tiles = math.ceil(batch / acts)
        for split in [s for s in SPLITS if s <= largest_split(k)]:
            tiles_per_wave = gpu.clusters_at_once(split) // m_tiles
            if tiles_per_wave == 0:
                continue
            wave = 1
            while (rows := 8 * math.ceil(n / (8 * wave * tiles_per_wave))) > most_rows:
                wave += 1
            stages = max_stages(rows, acts, split, weight_as_b=weight_as_b)
            tactic = SplitKTactic(rows, acts, split, stages, weight_as_b=weight_as_b)
            if tactic.stages >= MIN_STAGES and tactic.valid:
                found.append(tactic)
    found.sort(key=lambda t: (predicted_time_us(n, k, batch, t, gpu), str(t)))
    leaders = [t for t in (next((t for t in found if t.split == 1), None),
                           next((t for t in found if t.split > 1), None)) if t is not None]
    return leaders + [t for t in found if t not in leaders]


def padded_tile_tactics(n: int, k: int, batch: int, gpu: GpuSpec = H200, order=None) -> list[SplitKTactic]:
    """SM-filling weight-as-A tiles that are not whole warpgroups: the unsplit one in stages of 4
    and 2 boxes (at its deepest one-box pipeline where neither fits, as at K=128), then the best
    split one; where ``order`` pins (split, K boxes), the best one with that split in stages of
    that many boxes.

    Wide stages, not the deepest one-box pipeline: with 25 one-box stages the
    padded tile was the fastest back to back on 6288 x 7168 and 7168 x 14336 at
    M=1 but 2-4 us slower after glue; the same boxes in flight in stages of 2 or
    4 boxes kept its back-to-back time and lost little after glue (H200,
    docs/performance.md, v18).
    """
    found = [t for t in filling_tactics(n, k, batch, gpu, weight_as_b=False)
             if t.weight_smem_rows > t.weight_rows]
    if order is not None:
        split, k_boxes = order
        pinned = [with_k_boxes(t, k_boxes) for t in found if t.split == split]
        return [t for t in pinned if t.valid and t.stages >= 2 and fills_every_rank(t, k)][:1]
    unsplit = [t for t in found if t.split == 1][:1]
    wide = [with_k_boxes(t, boxes) for t in unsplit for boxes in reversed(K_BOXES[1:])]
    wide = [t for t in wide if t.valid and t.stages >= 2 and fills_every_rank(t, k)]
    return (wide or unsplit) + [t for t in found if t.split > 1][:1]


def folded_tactics(n: int, k: int, batch: int, gpu: GpuSpec = H200, order=None) -> list[SplitKTactic]:
    """Unsplit tiles narrow enough to fill the SMs in one wave with K folded into one warpgroup tile, at
    streaming batches, in stages of 4 boxes, then 2, then 1 (at the deepest pipeline, if it holds MIN_STAGES,
    where every K segment gets two stages or more); within each, the fold whose slots the tile fills best
    first. Where ``order`` pins (split, K boxes), those that sum in it (a fold sums as the split of as many).

    A padded tile of 28 rows keeps 28/64 of its shared memory's weight bytes in flight and a split
    one pays the reduction; folded, 3584 rows on 128 SMs keep 56/64 in flight and sum in the CTA.
    """
    acts = activation_rows_for(batch)
    tiles_per_wave = gpu.sm_count // math.ceil(batch / acts)
    if acts >= COMPUTE_BOUND_ROWS or tiles_per_wave == 0:
        return []
    rows = math.ceil(n / tiles_per_wave)
    found = []
    for boxes in reversed(K_BOXES):
        for fold in sorted(FOLDS[1:], reverse=True):
            stages = max_stages(rows, acts, 1, boxes, fold=fold)
            tactic = SplitKTactic(rows, acts, 1, stages, boxes, fold=fold)
            # Two stages of 4 boxes ran 3x slower on the H200 (42 against 15 us at M=64): one stage in flight.
            if tactic.valid and tactic.stages >= MIN_STAGES and math.ceil(math.ceil(k / tactic.tile_k) / fold) >= 2:
                found.append(tactic)
    return [t for t in found if order is None or t.summation_order == tuple(order)]


def with_k_boxes(tactic: SplitKTactic, k_boxes: int) -> SplitKTactic:
    """``tactic`` with ``k_boxes`` boxes per stage and the same boxes in flight (so no more shared memory)."""
    return replace(tactic, k_boxes=k_boxes, stages=tactic.stages * tactic.k_boxes // k_boxes)


def grid_ctas(tactic: SplitKTactic, n: int, batch: int) -> int:
    """CTAs of ``tactic``'s grid, weight tiles rounded up to whole multicast groups."""
    tiles = math.ceil(math.ceil(n / tactic.weight_rows) / tactic.multicast) * tactic.multicast
    return tiles * tactic.split * math.ceil(batch / tactic.activation_rows)


def waves(tactic: SplitKTactic, n: int, batch: int, gpu: GpuSpec = H200, per_sm: int = 1) -> int:
    """Waves ``tactic``'s grid takes with ``per_sm`` CTAs per SM, counted in whole clusters."""
    size = tactic.split * tactic.multicast
    clusters = grid_ctas(tactic, n, batch) // size
    return math.ceil(clusters / (gpu.clusters_at_once(size) * per_sm))


def fits_like(tactic: SplitKTactic, base: SplitKTactic, n: int, batch: int, gpu: GpuSpec = H200) -> bool:
    """False when ``tactic``'s grid needs more waves of one CTA per SM than ``base``'s."""
    return waves(tactic, n, batch, gpu) <= waves(base, n, batch, gpu)


def fills_every_rank(tactic: SplitKTactic, k: int) -> bool:
    """Every split rank gets at least two stages of K (the last one included)."""
    tiles = math.ceil(k / tactic.tile_k)
    per_rank = math.ceil(tiles / tactic.split)
    return tiles >= 2 * tactic.split and (tactic.split - 1) * per_rank < tiles


def candidate_tactics(n, k, batch, gpu: GpuSpec = H200, *, limit=8, order=None):
    """Up to ``limit`` valid tactics: the heuristic's pick, the cost model's best of each
    (weight rows, activation rows, split) family, then its best overall.

    The first slots go to those (all but the ones the groups below reserve:
    SHARED_LOAD_CANDIDATES, WIDE_STAGE_CANDIDATES where no order is pinned, and as
    many as the padded, folded, column-group and weight-as-B groups hold). Up to
    WIDE_STAGE_CANDIDATES of the slots after them go to 2- and 4-box variants of the
    first two (the model cannot tell stage widths apart: only timing can), unless
    ``order`` pins the split and K boxes; up to SHARED_LOAD_CANDIDATES to the first
    with its activation tile multicast to 2 and 4 weight tiles, from
    SHARED_LOAD_ROWS activation rows on (multicast never changes the sums), unless
    rounding the tiles up to whole groups would push a one-wave grid into a second;
    at streaming batches up to PADDED_TILE_CANDIDATES to SM-filling weight tiles
    that are not whole warpgroups (``padded_tile_tactics``; under a pinned order,
    one of that order: a padded tile sums as the whole tile does), and up to
    FOLDED_CANDIDATES to SM-filling tiles with K folded (``folded_tactics``; under a
    pinned order, those of a fold that sums in it); at compute-bound batches up to
    COLUMN_GROUP_CANDIDATES to the best 64-row tactics with two consumer
    warpgroups splitting the activation tile (the model
    cannot tell how busy they keep the tensor pipe: only timing can); and from
    WEIGHT_AS_B_ROWS activation rows on up to WEIGHT_AS_B_CANDIDATES to tactics with
    the weight as wgmma's B, unless ``order`` pins the summation order (the GPU
    tests verify batch invariance for the weight as A only). The groups fill the
    list in that order and what passes ``limit`` is dropped: at compute-bound
    batches the reserved slots alone exceed 8 (the H200 tables were tuned with 12 to
    16).
    """
    pick = default_tactic(n, k, batch, gpu, order=order)
    # Ties go to the deeper pipeline: they arise where every CTA has an SM to
    # itself, and there the deepest pipeline was faster in 60% of the timed pairs.
    ranked = sorted(pool_tactics(batch, k, gpu, order=order) - {pick},
                    key=lambda t: (predicted_time_us(n, k, batch, t, gpu), -t.stages * t.k_boxes, str(t)))
    family_bests = list({(t.weight_rows, t.activation_rows, t.split): t for t in reversed(ranked)}.values())
    family_bests.sort(key=ranked.index)
    chosen = [pick] + family_bests
    chosen += [t for t in ranked if t not in chosen]
    padded, folded, columns, weight_as_b = [], [], [], []
    activation_rows = activation_rows_for(batch)
    if activation_rows < COMPUTE_BOUND_ROWS:
        padded = padded_tile_tactics(n, k, batch, gpu, order)[:PADDED_TILE_CANDIDATES]
        folded = folded_tactics(n, k, batch, gpu, order)[:FOLDED_CANDIDATES]
    else:
        columns = [replace(t, column_groups=2) for t in chosen if t.weight_rows == WGMMA_ROWS]
        columns = [t for t in columns if t.valid][:COLUMN_GROUP_CANDIDATES]
    if activation_rows >= WEIGHT_AS_B_ROWS and order is None:
        weight_as_b = filling_tactics(n, k, batch, gpu, weight_as_b=True)[:WEIGHT_AS_B_CANDIDATES]
    reserved = SHARED_LOAD_CANDIDATES + (WIDE_STAGE_CANDIDATES if order is None else 0) + len(padded) \
        + len(columns) + len(weight_as_b) + len(folded)
    base = chosen[: max(1, limit - reserved)]
    wide = []
    if order is None:
        wide = [with_k_boxes(t, boxes) for t in base[:2] for boxes in K_BOXES[1:] if t.k_boxes == 1]
        wide = [t for t in wide if t.valid and fills_every_rank(t, k) and t not in base]
    shared = []
    if base[0].activation_rows >= SHARED_LOAD_ROWS:
        shared = [replace(base[0], multicast=group) for group in MULTICASTS[1:]]
        shared = [t for t in shared if t.valid and fits_like(t, base[0], n, batch, gpu)]
    rest = [t for t in chosen if t not in base]
    return (base + wide + shared + padded + folded + columns + weight_as_b + rest)[:limit]


def early_dependents_tactics(tactics, gpu: GpuSpec = H200) -> list[SplitKTactic]:
    """The first EARLY_DEPENDENTS_CANDIDATES of ``tactics`` that may let the next launch in as they start
    (unclustered, one CTA per SM, weight as A, streaming activation tiles), doing so."""
    eligible = [replace(t, dependents_at_start=True) for t in tactics
                if t.split * t.multicast == 1 and not t.weight_as_b and t.activation_rows < COMPUTE_BOUND_ROWS
                and ctas_per_sm(t, gpu) == 1]
    return list(dict.fromkeys(t for t in eligible if t not in tactics))[:EARLY_DEPENDENTS_CANDIDATES]


def resolve_policies(n, k, batches, *, gpu: GpuSpec, weight_dtype, output_dtype, batch_invariant=False,
                     use_tables=True):
    """``({batch: tactic}, {batch: "table" | "heuristic"})``: tuned entries where a table matches."""

    tuned, order = {}, None
    if use_tables:
        key = TableKey(gpu.name, gpu.sm_count, n, k, dtype_name(weight_dtype), dtype_name(output_dtype),
                       batch_invariant)
        tuned = table_policies(key, batches)
        # A batch-invariant table fixes the summation order for every batch, covered or not.
        order = table_summation_order(key)
    guessed = {
        b: default_tactic(n, k, b, gpu, batch_invariant=batch_invariant, order=order)
        for b in batches
        if b not in tuned
    }
    return {**guessed, **tuned}, {b: "table" if b in tuned else "heuristic" for b in batches}
