"""The tuner's candidates: the few tactics per cell worth timing on the GPU.

The tactic space has hundreds of valid points per (N, K, batch); the cost model
(``policies.predicted_time_us``) ranks them, and groups of reserved slots hold
what the model cannot tell apart and only timing can. ``candidate_tactics``
fills its list in this order and drops what passes its limit (at compute-bound
batches the reserved slots alone exceed 8: the H200 tables were tuned with 12 to 16):

1. The heuristic's pick (letting the next launch in late), the cost model's best
   of each (weight rows, activation rows, split) family, then its best overall:
   every slot the groups below do not reserve.
2. WIDE_STAGE_CANDIDATES 2- and 4-box variants of the first two (and a compute-bound
   pick's one-box twin where it has wide stages), unless an order pins the split and K boxes;
   then a streaming pick's twin in the other of splits 3 and 4 (SPLIT_TWIN_CANDIDATES), and a 64-row split-rule
   pick's twin in the 128-row tiles the rule turned away from at wide activation tiles, a short filling pick's in
   the split rule's tiles, and an unsplit-K or more-SMs weight-as-B pick's in the one-wave rule's (``rule_twins``).
3. SHARED_LOAD_CANDIDATES: the first with its activation tile multicast to 2 and 4
   weight tiles, from SHARED_LOAD_ROWS activation rows on (multicast never changes
   the sums), unless rounding the tiles up to whole groups would push a one-wave
   grid into a second.
4. Up to PADDED_TILE_ROWS activation rows, PADDED_TILE_CANDIDATES SM-filling weight
   tiles that are not whole warpgroups (``padded_tile_tactics``; under a pinned order
   one of that order: a padded tile sums as the whole tile does); at streaming
   batches FOLDED_CANDIDATES with K folded (``folded_tactics``; under a pinned order,
   a fold that sums in it).
5. BUFFERED_PARTIALS_CANDIDATES split tactics without a buffer for their partials (those of group 1 that share
   an SM first, then those of groups 4 and 1), in fewer stages that leave them one (``buffered_partials_tactics``).
6. At compute-bound batches, COLUMN_GROUP_CANDIDATES of the best 64-row tactics
   with the other count of consumer warpgroups splitting the activation tile (two;
   one for a pick that has two): how busy they keep the tensor pipe is for timing to tell.
7. From WEIGHT_AS_B_ROWS activation rows on, WEIGHT_AS_B_CANDIDATES with the
   weight as wgmma's B, unless an order is pinned (the GPU tests verify batch
   invariance for the weight as A only), then SHARED_WEIGHT_CANDIDATES whose
   weight tile is multicast to the batch's 2 to 4 activation tiles (``shared_weight_tactics``)
   and SHARED_WEIGHT_BUFFERED_CANDIDATES of those in fewer stages that buffer their partials.

The tuner adds the twins of some that let the next launch in as they start
(``early_dependents_tactics``).
"""

import math
from dataclasses import replace

from ..kernel.tactic import (
    ACTIVATION_ROWS_AS_A, FOLDS, K_BOXES, MOST_PARTIALS_OF_FOUR_GROUPS, MULTICASTS, SPLITS, WEIGHT_ROWS,
    WEIGHT_ROWS_AS_A, WEIGHT_ROWS_AS_B, SplitKTactic, max_stages,
)
from ..policy.policies import (
    COMPUTE_BOUND_ROWS, HEURISTIC_WEIGHT_ROWS, MIN_FILLING_ROWS, MIN_STAGES, MOST_CTAS_PER_SM,
    activation_rows_for, activation_tile_choices, covering_rows, ctas_per_sm, default_tactic, filling_tactic,
    largest_split, may_start_dependents_early, more_sms_as_b_tactic, one_wave_tactic, predicted_time_us,
    split_rule_tactic, stages_sharing_an_sm, unsplit_k_tactic, waves,
)
from ..runtime.gpu import H200, GpuSpec
from ..runtime.sm90 import PORTABLE_CLUSTER, WGMMA_ROWS

WIDE_STAGE_CANDIDATES = 4  # slots for 2- and 4-box variants of the best one-box tactics
SHARED_LOAD_CANDIDATES = 2  # slots for the best tactic with its activations shared by the other of 1, 2 and 4 tiles
SHARED_LOAD_ROWS = 32  # activation tiles from here on cost enough L2 traffic to share
COLUMN_GROUP_CANDIDATES = 2  # slots for the best 64-row tactics in the other count of column groups
WEIGHT_AS_B_CANDIDATES = 4  # slots for the best tactics with the weight as wgmma's B, sized to fill the SMs
# Slots for weight-as-B tiles whose weight tile is multicast to every activation tile of the batch: on the H200 each
# 128-row pair ran 0.6-1.0 us faster back to back than its unshared tile at M=256 and 0.1-2.3 us after glue, and three
# 64-row tiles sharing 96-row weight tiles took 3072 x 7168 M=192 from 20.8 to 18.3 us (docs/compute-bound-tiling.md).
SHARED_WEIGHT_CANDIDATES = 3
PADDED_TILE_CANDIDATES = 3  # slots for SM-filling weight-as-A tiles padded to whole warpgroups (padded_tile_tactics)
# Padded tiles are offered up to this many activation rows: at M=96 on 6288 x 7168, 131 tiles of 48 rows in 2-box
# stages ran 24.90 us back to back against 26.94 for the best whole tile (docs/padded-and-folded-tiles.md).
PADDED_TILE_ROWS = 96
FOLDED_CANDIDATES = 2  # slots for SM-filling tiles with K folded into one warpgroup tile (folded_tactics)
# Slots for split tactics without a buffer for their partials, in fewer stages that leave them one with as many CTAs
# per SM (buffered_partials_tactics). On the H200, 2304 x 1536 M=64 ran (64,64,3,5) 0.43 us faster after glue than
# (64,64,3,7) and 0.03 us slower back to back, where at K = 7168 the fewer stages of two CTAs per SM lost 0.2-0.5 us
# (docs/split-k-reduction.md); with one CTA per SM, 3584 x 7168 M=64 ran the padded split tile (56,64,2,6,2)
# 0.2-0.3 us faster both ways than (56,64,2,7,2) and M=48 (56,48,2,7,2) 0.2 us faster back to back than
# (56,48,2,8,2).
BUFFERED_PARTIALS_CANDIDATES = 2
# A slot for a streaming pick's twin in the other of splits 3 and 4: the heuristic chooses between them by a fill
# fitted to three shapes (policies.streaming_splits), which every tune of such a shape keeps judging.
SPLIT_TWIN_CANDIDATES = 1
# A slot for the buffered twin of a split shared-weight tactic, the one that gives up the smallest share of its
# stages: on the H200 2112 x 7168 M=256 (80,128,2,7,1,2,1,B) ran 0.85 us faster back to back and 0.55 after glue
# than the then shipped (144,128,4,6,1,2,1,B); as the fourth shared-weight tactic in 8 stages it had no slot.
SHARED_WEIGHT_BUFFERED_CANDIDATES = 1
# From these activation rows on the weight as B is worth timing: at M=64 its SM-filling tiles beat every
# weight-as-A tactic on the largest weights by 3-4% (6288 x 7168: 48 x 64 tiles, 131 CTAs; 20480 x 7168:
# 160 x 64, 128 CTAs), where 64 activation rows do 64 FLOP per weight byte (docs/compute-bound-tiling.md).
WEIGHT_AS_B_ROWS = 32
# Unclustered tactics with an SM to themselves and streaming tiles (fewer than COMPUTE_BOUND_ROWS activation rows)
# are also timed letting the next launch in as they start (SplitKTactic.dependents_at_start). On the H200 that won
# 0.95 us back to back with 8-16 activation rows and 0.75 us with staged tiles (medians of 211 and 124 pairs) on
# weights of 40 MB and more, and lost up to 7 us on some; where two or more CTAs fit on an SM it lost 2-24 us
# there (docs/programmatic-launch.md). Timing decides, for this many.
EARLY_DEPENDENTS_CANDIDATES = 3


def pool_tactics(k: int, batch: int, gpu: GpuSpec = H200, *, order=None) -> set[SplitKTactic]:
    """Each tile and split at the deepest pipeline that lets 1 to MOST_CTAS_PER_SM CTAs share an SM (so a
    grid can fit in one wave), in one-box stages unless ``order`` = (split, k boxes) pins both."""
    splits = [order[0]] if order is not None else [s for s in SPLITS if s <= largest_split(k, gpu)]
    k_boxes = order[1] if order is not None else 1
    pool = set()
    for acts in activation_tile_choices(batch):
        # Three warpgroups only pay where the tensor cores bound the time.
        for rows in [r for r in WEIGHT_ROWS if r in HEURISTIC_WEIGHT_ROWS or acts >= COMPUTE_BOUND_ROWS]:
            for s in splits:
                for resident in range(1, MOST_CTAS_PER_SM + 1):
                    stages = stages_sharing_an_sm(rows, acts, s, k_boxes, per_sm=resident, gpu=gpu)
                    tactic = SplitKTactic(rows, acts, s, stages, k_boxes=k_boxes)
                    if stages >= MIN_STAGES and tactic.valid:
                        pool.add(tactic)
    return pool


def unsplit_and_split_first(tactics, n: int, k: int, batch: int, gpu: GpuSpec = H200) -> list[SplitKTactic]:
    """``tactics`` by predicted time, the best without split K and the best with it first (the cost model was not
    fitted to SM-filling and shared tiles, so both kinds get a slot)."""
    ranked = sorted(tactics, key=lambda t: (predicted_time_us(n, k, batch, t, gpu), str(t)))
    leaders = [t for t in (next((t for t in ranked if t.split == 1), None),
                           next((t for t in ranked if t.split > 1), None)) if t is not None]
    return leaders + [t for t in ranked if t not in leaders]


def filling_tactics(n: int, k: int, batch: int, gpu: GpuSpec = H200, *, weight_as_b: bool) -> list[SplitKTactic]:
    """Per activation tile and split, the narrowest weight tile of 8k rows whose grid fills the fewest waves."""
    # 64-row weight tiles leave SMs idle where N / 64 tiles do not divide the SMs (7168 rows fill 112 of 132);
    # a tile of any multiple of 8 rows can fill them (128 tiles of 56). With the weight as B the activations
    # are wgmma's A, one to four 64-row tiles; with the weight as A its tile is padded to whole warpgroups in
    # shared memory (SplitKTactic.weight_smem_rows).
    found = []
    if weight_as_b:
        # Tiles up to the first that covers the batch: a wider one would only add zero rows (at streaming
        # batches one 64-row tile covers it).
        covered = activation_rows_for(batch)
        activation_tiles = [a for a in ACTIVATION_ROWS_AS_A if a < covered + WGMMA_ROWS]
        most_rows = WEIGHT_ROWS_AS_B[-1]
    else:
        activation_tiles, most_rows = [activation_rows_for(batch)], WEIGHT_ROWS_AS_A[-1]
    for acts in activation_tiles:
        m_tiles = math.ceil(batch / acts)
        # Four warpgroups of activations hold the accumulators of at most 2 x MOST_PARTIALS_OF_FOUR_GROUPS columns.
        four_groups = weight_as_b and acts == 4 * WGMMA_ROWS
        rows_cap = 2 * MOST_PARTIALS_OF_FOUR_GROUPS if four_groups else most_rows
        for split in [s for s in SPLITS if s <= largest_split(k, gpu)]:
            tiles_per_wave = gpu.clusters_at_once(split) // m_tiles
            if tiles_per_wave == 0:
                continue
            wave = 1
            while (rows := covering_rows(n, wave * tiles_per_wave)) > rows_cap:
                wave += 1
            if weight_as_b and SplitKTactic(rows, acts, split, 2, weight_as_b=True).reallocates_registers:
                rows = 16 * math.ceil(rows / 16)  # wgmma N, halved where registers are reallocated, is 8k
            stages = max_stages(rows, acts, split, weight_as_b=weight_as_b)
            tactic = SplitKTactic(rows, acts, split, stages, weight_as_b=weight_as_b)
            if tactic.stages >= MIN_STAGES and tactic.valid:
                found.append(tactic)
    return unsplit_and_split_first(found, n, k, batch, gpu)


def padded_tile_tactics(n: int, k: int, batch: int, gpu: GpuSpec = H200, order=None) -> list[SplitKTactic]:
    """SM-filling weight-as-A tiles that are not whole warpgroups: the unsplit one in 4- and 2-box stages
    (else one-box, as at K=128), then the best split one; under ``order``, the best of its split and boxes."""
    # Wide stages, not the deepest one-box pipeline: with 25 one-box stages the padded tile was the fastest
    # back to back on 6288 x 7168 and 7168 x 14336 at M=1 but 2-4 us slower after glue; the same boxes in
    # flight in stages of 2 or 4 boxes kept its back-to-back time and lost little after glue
    # (docs/padded-and-folded-tiles.md).
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
    """Unsplit one-wave tiles with K folded into one warpgroup tile, at streaming batches: 4-, 2-, then
    1-box stages, the best-filled fold first; under ``order``, those that sum in it (as the split of the fold)."""
    # A padded tile of 28 rows keeps 28/64 of its shared memory's weight bytes in flight and a split one pays
    # the reduction; folded, 3584 rows on 128 SMs keep 56/64 in flight and sum in the CTA. Each candidate takes
    # the deepest pipeline, if it holds MIN_STAGES and gives every K segment two stages or more.
    acts = activation_rows_for(batch)
    tiles_per_wave = gpu.sm_count // math.ceil(batch / acts)
    if acts >= COMPUTE_BOUND_ROWS or tiles_per_wave == 0:
        return []
    rows = math.ceil(n / tiles_per_wave)
    found = []
    for boxes in reversed(K_BOXES):
        for fold in sorted(FOLDS[1:], reverse=True):
            stages = max_stages(rows, acts, 1, boxes, fold=fold)
            tactic = SplitKTactic(rows, acts, 1, stages, k_boxes=boxes, fold=fold)
            # Two stages of 4 boxes ran 3x slower on the H200 (42 against 15 us at M=64): one stage in flight.
            if tactic.valid and tactic.stages >= MIN_STAGES and tactic.k_slice(k, rank=0).stages >= 2:
                found.append(tactic)
    return [t for t in found if order is None or t.summation_order == tuple(order)]


def shared_weight_tactics(n: int, k: int, batch: int, gpu: GpuSpec = H200) -> list[SplitKTactic]:
    """Per activation tile that covers the batch in 2 to 4 tiles, and split, the narrowest weight tile whose
    clusters (every activation tile sharing it) fit at once; the best predicted unsplit and split first."""
    # The kernel moves a last tile partly past the batch back to end at its last row: partly past it, such a tile
    # ran its cluster 1.2-1.6x slower; moved back, 6288 x 7168 M=96 on two 64-row tiles took 25.3 us, as M=128
    # did, against 29.5 (docs/compute-bound-tiling.md).
    # Clusters of 4 to 8 CTAs fit fewer than SMs / size at once (GpuSpec.cluster_slots): every slow shared tile of the
    # first H200 probes of shared weight tiles needed a second wave of clusters.
    # Tiles partly past the batch only where no tile divides it: at M=192 a pair of 128-row tiles (a third of its
    # rows repeated) ran 38.0 us against 34.4 for three 64-row tiles.
    dividing = [a for a in ACTIVATION_ROWS_AS_A if batch % a == 0 and batch // a in MULTICASTS[1:]]
    found = []
    for acts in dividing or ACTIVATION_ROWS_AS_A:
        sharers = math.ceil(batch / acts)
        if sharers not in MULTICASTS[1:]:
            continue
        rows_cap = 2 * MOST_PARTIALS_OF_FOUR_GROUPS if acts == 4 * WGMMA_ROWS else WEIGHT_ROWS_AS_B[-1]
        for split in [s for s in SPLITS if s <= largest_split(k, gpu) and s * sharers <= PORTABLE_CLUSTER
                      and gpu.clusters_at_once(s * sharers) > 0]:
            load_rows = 8 * sharers
            rows = load_rows * math.ceil(n / (load_rows * gpu.clusters_at_once(split * sharers)))
            if SplitKTactic(rows, acts, split, 2, weight_as_b=True).reallocates_registers:
                whole = math.lcm(load_rows, 16)  # wgmma N, halved where registers are reallocated, is 8k
                rows = whole * math.ceil(rows / whole)
            tactic = SplitKTactic(rows, acts, split, max_stages(rows, acts, split, weight_as_b=True), multicast=sharers,
                                  weight_as_b=True)
            if rows <= rows_cap and tactic.stages >= MIN_STAGES and tactic.valid:
                found.append(tactic)
    return unsplit_and_split_first(found, n, k, batch, gpu)


def buffered_partials_tactics(tactics, gpu: GpuSpec = H200) -> list[SplitKTactic]:
    """Each split tactic of ``tactics`` with no buffer for its partials, in the most stages that give it one
    (SplitKTactic.reduction_buffered) with as many CTAs per SM."""
    found = []
    for tactic in [t for t in tactics if t.split > 1 and not t.reduction_buffered]:
        per_sm = ctas_per_sm(tactic, gpu)
        fewer = [replace(tactic, stages=stages) for stages in range(tactic.stages - 1, MIN_STAGES - 1, -1)]
        found += [t for t in fewer if t.valid and t.reduction_buffered and ctas_per_sm(t, gpu) == per_sm][:1]
    return list(dict.fromkeys(found))


def buffered_keeping_most_stages(tactics, gpu: GpuSpec = H200) -> list[SplitKTactic]:
    """The buffered twins of ``tactics`` (``buffered_partials_tactics``), those that give up the smallest share of
    their stages first."""
    depth = {replace(t, stages=0): t.stages for t in tactics}
    twins = buffered_partials_tactics(tactics, gpu)
    return sorted(twins, key=lambda twin: -twin.stages / depth[replace(twin, stages=0)])


def split_twins(pick: SplitKTactic, k: int, order=None) -> list[SplitKTactic]:
    """``pick``'s twin in the other of splits 3 and 4 where ``pick`` streams with one of them and no order pins the
    split: split 3 in one-box stages (the form that won the H200 tunes), or split 4 in ``pick``'s own stages (the
    streaming rule's pick where it does not split 3: policies.streaming_splits), so that the rule stays judged."""
    if order is not None or pick.split not in (3, 4) or pick.activation_rows >= COMPUTE_BOUND_ROWS:
        return []
    rows, acts = pick.weight_rows, pick.activation_rows
    if pick.split == 4:
        twin = SplitKTactic(rows, acts, 3, max_stages(rows, acts, 3))
    else:
        twin = replace(pick, split=4, stages=max_stages(rows, acts, 4, pick.k_boxes))
    return [twin][:SPLIT_TWIN_CANDIDATES] if twin.valid and fills_every_rank(twin, k) else []


def rule_twins(pick: SplitKTactic, n: int, k: int, batch: int, gpu: GpuSpec = H200, order=None) -> list[SplitKTactic]:
    """What the heuristic's rules turned away from, so that the timings keep judging them: where ``pick`` is the
    split rule's with 64-row tiles at a wide activation tile, its pick without that (``split_rule_tactic(...,
    wide_rule=False)``); where ``pick`` is a filling tile under MIN_FILLING_ROWS rows, the split rule's pick; where
    ``pick`` is ``unsplit_k_tactic``'s or ``more_sms_as_b_tactic``'s, the one-wave rule's."""
    if order is not None:
        twins = []
    elif pick.activation_rows >= COMPUTE_BOUND_ROWS:
        turned_away = pick in (unsplit_k_tactic(n, k, batch, gpu), more_sms_as_b_tactic(n, k, batch, gpu))
        twins = [one_wave_tactic(n, k, batch, gpu)] if turned_away else []
    elif pick == split_rule_tactic(n, k, batch, gpu):
        twins = [split_rule_tactic(n, k, batch, gpu, wide_rule=False)]
    elif pick.weight_rows < MIN_FILLING_ROWS and pick == filling_tactic(n, k, batch, gpu):
        twins = [split_rule_tactic(n, k, batch, gpu)]
    else:
        twins = []
    return [twin for twin in twins if twin != pick]


def with_k_boxes(tactic: SplitKTactic, k_boxes: int) -> SplitKTactic:
    """``tactic`` with ``k_boxes`` boxes per stage and the same boxes in flight (so no more shared memory)."""
    return replace(tactic, k_boxes=k_boxes, stages=tactic.stages * tactic.k_boxes // k_boxes)


def fits_like(tactic: SplitKTactic, base: SplitKTactic, n: int, batch: int, gpu: GpuSpec = H200) -> bool:
    """False when ``tactic``'s grid needs more waves of one CTA per SM than ``base``'s."""
    return waves(tactic, n, batch, gpu) <= waves(base, n, batch, gpu)


def fills_every_rank(tactic: SplitKTactic, k: int) -> bool:
    """The split ranks get two stages of K each on average, and the last one gets some."""
    return tactic.k_tiles(k) >= 2 * tactic.split and tactic.k_slice(k, tactic.split - 1).stages > 0


def candidate_tactics(n, k, batch, gpu: GpuSpec = H200, *, limit=8, order=None):
    """Up to ``limit`` valid tactics for one cell, the groups of the module docstring in their order."""
    # A streaming pick that lets the next launch in early is listed late: its early twin comes first among the
    # tuner's (early_dependents_tactics), so both ways are timed, as for every other candidate.
    pick = replace(default_tactic(n, k, batch, gpu, order=order), dependents_at_start=False)
    # Ties go to the deeper pipeline: they arise where every CTA has an SM to
    # itself, and there the deepest pipeline was faster in 60% of the timed pairs.
    ranked = sorted(pool_tactics(k, batch, gpu, order=order) - {pick},
                    key=lambda t: (predicted_time_us(n, k, batch, t, gpu), -t.stages * t.k_boxes, str(t)))
    family_bests = list({(t.weight_rows, t.activation_rows, t.split): t for t in reversed(ranked)}.values())
    family_bests.sort(key=ranked.index)
    chosen = [pick] + family_bests
    chosen += [t for t in ranked if t not in chosen]
    padded, folded, columns, weight_as_b, shared_weight = [], [], [], [], []
    activation_rows = activation_rows_for(batch)
    if activation_rows <= PADDED_TILE_ROWS:
        padded = padded_tile_tactics(n, k, batch, gpu, order)[:PADDED_TILE_CANDIDATES]
    if activation_rows < COMPUTE_BOUND_ROWS:
        folded = folded_tactics(n, k, batch, gpu, order)[:FOLDED_CANDIDATES]
    else:
        # The other count of column groups: two for the pool's tactics, one for a pick that already has two (so
        # that its rule stays judged by the timings).
        columns = [replace(t, column_groups=2 if t.column_groups == 1 else 1)
                   for t in chosen if t.weight_rows == WGMMA_ROWS]
        columns = [t for t in columns if t.valid][:COLUMN_GROUP_CANDIDATES]
    if activation_rows >= WEIGHT_AS_B_ROWS and order is None:
        weight_as_b = filling_tactics(n, k, batch, gpu, weight_as_b=True)[:WEIGHT_AS_B_CANDIDATES]
        every_shared_weight = shared_weight_tactics(n, k, batch, gpu)
        shared_weight = [t for t in every_shared_weight if t not in weight_as_b][:SHARED_WEIGHT_CANDIDATES]
        shared_weight += buffered_keeping_most_stages(every_shared_weight, gpu)[:SHARED_WEIGHT_BUFFERED_CANDIDATES]
    split_twin = [t for t in split_twins(pick, k, order) + rule_twins(pick, n, k, batch, gpu, order)
                  if t not in padded + folded]
    sharing = [t for t in chosen if ctas_per_sm(t, gpu) > 1]
    buffered = [t for t in buffered_partials_tactics(sharing + padded + chosen, gpu) if t not in chosen + padded]
    buffered = buffered[:BUFFERED_PARTIALS_CANDIDATES]
    reserved = SHARED_LOAD_CANDIDATES + (WIDE_STAGE_CANDIDATES if order is None else 0) + len(padded) \
        + len(columns) + len(weight_as_b) + len(shared_weight) + len(folded) + len(buffered) + len(split_twin)
    base = chosen[: max(1, limit - reserved)]
    wide = []
    if order is None:
        wide = [with_k_boxes(t, boxes) for t in base[:2] for boxes in K_BOXES[1:] if t.k_boxes == 1]
        if activation_rows >= COMPUTE_BOUND_ROWS and base[0].k_boxes > 1:
            # A one-wave pick in wide stages (policies.one_wave_tactic): its one-box twin, so that the rule stays
            # judged by the timings.
            wide.append(with_k_boxes(base[0], 1))
        wide = [t for t in wide if t.valid and fills_every_rank(t, k) and t not in base]
    shared = []
    if base[0].activation_rows >= SHARED_LOAD_ROWS:
        # The other sharing counts of 1, 2 and 4 (the heuristic's pick may already share).
        shared = [replace(base[0], multicast=group) for group in MULTICASTS if group not in (3, base[0].multicast)]
        shared = [t for t in shared if t.valid and fits_like(t, base[0], n, batch, gpu)]
    rest = [t for t in chosen if t not in base]
    ordered = (base + wide + split_twin + shared + padded + folded + buffered + columns + weight_as_b + shared_weight
               + rest)
    return list(dict.fromkeys(ordered))[:limit]  # once each: the pick may be one of the padded tiles too


def early_dependents_tactics(tactics, gpu: GpuSpec = H200) -> list[SplitKTactic]:
    """The first EARLY_DEPENDENTS_CANDIDATES of ``tactics`` that may let the next launch in as they start
    (unclustered, one CTA per SM, weight as A, streaming activation tiles), doing so."""
    eligible = [replace(t, dependents_at_start=True) for t in tactics if may_start_dependents_early(t, gpu)]
    return list(dict.fromkeys(t for t in eligible if t not in tactics))[:EARLY_DEPENDENTS_CANDIDATES]
