"""The tactic grid that the compile-only (CPU) and the float64 (GPU) tests both cover."""

import itertools

import torch

from decode_projection import SplitKTactic
from decode_projection.kernel.splitk import STAGED_STORE_ROWS
from decode_projection.kernel.tactic import ACTIVATION_ROWS, K_BOXES, max_stages

# Every tile and split at a short pipeline.
GRID = [
    SplitKTactic(rows, acts, split, min(4, max_stages(rows, acts, split)))
    for rows, acts, split in itertools.product((64, 128), ACTIVATION_ROWS, (1, 2, 4, 8))
]
# Three consumer warpgroups (192 weight rows): splits, a deep pipeline, the widest activation tile
# without register reallocation, multicast and wide stages; then 256 activation rows, where a producer
# warpgroup gives its registers to the consumers, with split K, multicast and wide stages.
GRID += [
    SplitKTactic(192, 8, 1, 4), SplitKTactic(192, 64, 2, 4), SplitKTactic(192, 96, 1, 4),
    SplitKTactic(192, 128, 4, 4), SplitKTactic(192, 192, 1, 3), SplitKTactic(192, 48, 8, 3),
    SplitKTactic(192, 16, 1, max_stages(192, 16, 1)), SplitKTactic(192, 32, 1, 4, multicast=2),
    SplitKTactic(192, 16, 3, 4, k_boxes=2),
    SplitKTactic(192, 256, 1, 4), SplitKTactic(192, 256, 4, 4), SplitKTactic(192, 256, 3, 4, multicast=2),
    SplitKTactic(192, 256, 2, 2, k_boxes=2),
]
# Cluster sizes that are not powers of two (uneven K slices, ranks with no K tiles).
GRID += [SplitKTactic(64, 8, 3, 6), SplitKTactic(128, 32, 5, 4), SplitKTactic(64, 64, 6, 4), SplitKTactic(128, 128, 7, 3)]
# The deepest pipelines, where shared memory is nearly full.
GRID += [SplitKTactic(64, 8, 4, max_stages(64, 8, 4)), SplitKTactic(128, 64, 2, max_stages(128, 64, 2))]
# Stages of 2 and 4 TMA boxes along K (K tails inside a stage, fewer K tiles than ranks).
GRID += [
    tactic
    for rows, acts, split, boxes in itertools.product((64, 128), (8, 64, 128), (1, 4), K_BOXES[1:])
    if (tactic := SplitKTactic(rows, acts, split, min(3, max_stages(rows, acts, split, boxes)), k_boxes=boxes)).valid
]

# Activation tiles shared by TMA multicast across 2 or 4 weight tiles: tile counts that are not a
# multiple of the group, clusters of up to 8 CTAs with split K, wide stages.
GRID += [
    SplitKTactic(64, 64, 1, 3, multicast=2), SplitKTactic(64, 128, 2, 3, multicast=4),
    SplitKTactic(128, 32, 2, 4, multicast=2), SplitKTactic(64, 32, 4, 4, k_boxes=2, multicast=2),
    SplitKTactic(128, 256, 1, 2, multicast=4), SplitKTactic(64, 16, 2, 6, multicast=2),
]

# Weight tiles of any multiple of 8 rows with the weight as A, padded to whole warpgroups in shared memory:
# one, two and three warpgroups, the narrowest tile, split K with uneven slices, multicast, wide stages,
# register reallocation, and a tile so narrow that most of its warpgroup tile is padding.
GRID += [
    SplitKTactic(56, 8, 1, max_stages(56, 8, 1, 2), k_boxes=2), SplitKTactic(48, 16, 2, 6), SplitKTactic(160, 8, 1, 6),
    SplitKTactic(112, 64, 3, 4), SplitKTactic(40, 32, 1, 4, multicast=4), SplitKTactic(120, 48, 2, 2, k_boxes=4),
    SplitKTactic(184, 256, 1, 2), SplitKTactic(8, 8, 5, 8), SplitKTactic(24, 128, 1, 4, multicast=2),
    # Padded tiles sharing their activation load, as the tuner offers them: 48 rows loaded as two halves of 24.
    SplitKTactic(56, 64, 1, 4, k_boxes=2, multicast=2), SplitKTactic(48, 48, 1, 4, k_boxes=2, multicast=2),
]

# Two consumer warpgroups splitting the activation tile of a 64-row weight tile: with split K (a reduction
# over 256 threads of half-tile accumulators), multicast, wide stages and partly filled batches.
GRID += [
    SplitKTactic(64, 256, 1, 5, column_groups=2), SplitKTactic(64, 128, 2, 4, column_groups=2),
    SplitKTactic(64, 192, 3, 3, column_groups=2), SplitKTactic(64, 256, 2, 4, multicast=2, column_groups=2),
    SplitKTactic(64, 128, 1, 3, k_boxes=2, column_groups=2), SplitKTactic(64, 256, 8, 2, column_groups=2),
]

# The weight as wgmma's B (activations A, one to four warpgroups of 64 rows), in weight tiles of any multiple
# of 8 rows: ragged N tiles, split K with uneven slices, wide stages, the narrowest and widest tiles, and the weight
# tile multicast to 2, 3 or 4 activation tiles (one batch leaves the cluster's other tiles past M).
GRID += [
    SplitKTactic(rows, acts, split, stages, k_boxes=boxes, multicast=multicast, weight_as_b=True)
    for rows, acts, split, stages, boxes, multicast in (
        (112, 128, 1, 4, 1, 1), (96, 64, 2, 4, 1, 1), (256, 128, 1, 3, 1, 1), (8, 64, 3, 4, 2, 1),
        (112, 128, 2, 4, 1, 2), (32, 128, 1, 5, 1, 4), (56, 64, 4, 3, 4, 1), (200, 128, 7, 3, 1, 1),
        (24, 128, 1, 11, 1, 1), (144, 128, 4, 6, 1, 2), (64, 64, 2, 4, 2, 4), (256, 64, 1, 3, 1, 2),
        (168, 64, 1, 7, 1, 3), (96, 64, 2, 5, 2, 3),
        # The SM-filling tiles the tuner found at streaming batches (one 64-row activation tile).
        (48, 64, 1, 16, 1, 1), (160, 64, 1, 8, 1, 1),
        # Three and four warpgroups of activations: registers reallocated or not, split K (with them too), multicast.
        (48, 192, 1, 7, 1, 1), (208, 192, 1, 3, 1, 1), (64, 192, 3, 4, 1, 2),
        (160, 256, 1, 4, 1, 1), (128, 256, 2, 3, 1, 1), (96, 256, 5, 2, 2, 1), (48, 256, 1, 4, 1, 2),
        (160, 256, 1, 4, 1, 2),
        (144, 256, 3, 4, 1, 1), (208, 192, 2, 4, 1, 1),
    )
]


# Launches that let the next one in as they start: a whole and a padded tile, wide stages, staged epilogues
# (whole, padded, and split between two consumer warpgroups).
GRID += [
    SplitKTactic(64, 8, 1, 6, k_boxes=4, dependents_at_start=True),
    SplitKTactic(56, 16, 1, 5, k_boxes=4, dependents_at_start=True),
    SplitKTactic(160, 8, 1, 4, k_boxes=2, dependents_at_start=True),
    SplitKTactic(64, 64, 1, 4, dependents_at_start=True),
    SplitKTactic(48, 64, 1, 7, k_boxes=2, dependents_at_start=True),
    SplitKTactic(64, 128, 1, 3, k_boxes=2, column_groups=2, dependents_at_start=True),
]

# K folded into one warpgroup tile (split 1): two and four segments, tiles of any row count up to the slot, wide
# stages, activation tiles up to 128 rows (wgmma N of 256), an early launch.
GRID += [
    SplitKTactic(rows, acts, 1, stages, k_boxes=boxes, dependents_at_start=early, fold=fold)
    for rows, acts, stages, boxes, early, fold in (
        (28, 8, 5, 4, True, 2), (32, 16, 6, 2, False, 2), (17, 32, 8, 1, False, 2), (24, 64, 4, 2, False, 2),
        (16, 8, 4, 4, True, 4), (12, 16, 3, 4, False, 4), (5, 64, 3, 1, False, 4), (32, 128, 2, 1, False, 2),
    )
]


def tactic_id(tactic: SplitKTactic) -> str:
    """A short test id: w<weight rows>-a<activation rows>-s<split>-st<stages>-kb<k boxes>-mc<multicast>-cg<column
    groups>, then -wb where the weight is wgmma's B, -early where the next launch is let in as it starts and
    -f<fold> where K is folded."""
    return (f"w{tactic.weight_rows}-a{tactic.activation_rows}-s{tactic.split}-st{tactic.stages}"
            f"-kb{tactic.k_boxes}-mc{tactic.multicast}-cg{tactic.column_groups}{'-wb' if tactic.weight_as_b else ''}"
            f"{'-early' if tactic.dependents_at_start else ''}{f'-f{tactic.fold}' if tactic.fold > 1 else ''}")


def code_path(tactic: SplitKTactic) -> tuple:
    """The branches of the kernel's code that a tactic takes with a 16-bit output: tactics of one path differ only in
    sizes (tile shapes, stages, split, sharers)."""
    split = tactic.split > 1
    return (
        split, split and tactic.keeps_own_partials, split and tactic.reduction_buffered,
        split and tactic.reduction_vector, tactic.weight_sharers > 1, tactic.activation_sharers > 1,
        tactic.weight_as_b, tactic.fold > 1, tactic.dependents_at_start, tactic.reallocates_registers,
        tactic.weight_smem_rows > tactic.weight_rows, not split and tactic.activation_rows >= STAGED_STORE_ROWS,
        tactic.column_groups, tactic.k_boxes,
    )


# One tactic per store path: direct, staged (16-bit outputs of 32+ rows; a padded 56-row tile too), folded K,
# split-K reductions (partials kept in registers in the drained stages, sent by every rank, in a buffer of their
# own, with multicast), the weight as B with multicast, two column groups.
EPILOGUE_PATHS = [
    SplitKTactic(64, 8, 1, 6, k_boxes=4),
    SplitKTactic(128, 64, 1, 6),
    SplitKTactic(56, 48, 1, 4, k_boxes=2),
    SplitKTactic(16, 8, 1, 4, k_boxes=4, fold=4),
    SplitKTactic(32, 16, 1, 6, k_boxes=2, fold=2),  # four folded outputs a thread, of one weight row's bias
    SplitKTactic(64, 64, 4, 4),
    SplitKTactic(192, 64, 2, 4),
    SplitKTactic(128, 8, 4, 6, k_boxes=2),
    SplitKTactic(64, 32, 4, 4, k_boxes=2, multicast=2),
    SplitKTactic(48, 128, 1, 10, multicast=2, weight_as_b=True),
    SplitKTactic(64, 256, 1, 4, column_groups=2),
]
# (weight dtype, output dtype, bias dtype or None, residual: "none", "in place" or "apart")
EPILOGUE_CASES = [
    (torch.bfloat16, torch.bfloat16, torch.float32, "none"),
    (torch.bfloat16, torch.bfloat16, None, "in place"),
    (torch.bfloat16, torch.float32, torch.bfloat16, "apart"),
    (torch.float16, torch.float16, torch.float16, "in place"),
    (torch.float16, torch.float16, None, "apart"),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, "apart"),
]
# Gated projections (weight as A, whole 16-row groups): direct stores of one warpgroup and of a padded 32-row tile,
# staged (a padded 48-row tile too), activations multicast, two column groups, three warpgroups; folded; split K.
GATED_PATHS = [
    SplitKTactic(64, 8, 1, 6, k_boxes=4),
    SplitKTactic(32, 8, 1, 12, k_boxes=2),
    SplitKTactic(128, 64, 1, 6),
    SplitKTactic(48, 64, 1, 7, k_boxes=2),
    SplitKTactic(64, 64, 1, 3, multicast=2),
    SplitKTactic(64, 256, 1, 4, column_groups=2),
    SplitKTactic(192, 16, 1, 4),
    # Folded K, summed through shared memory: a whole slot of two groups (what a 24-row folded tile rounds up to
    # where twice its rows split in two would not fit a wave) and one group in a slot of 16 rows.
    SplitKTactic(32, 8, 1, 11, k_boxes=2, dependents_at_start=True, fold=2),
    SplitKTactic(32, 16, 1, 9, k_boxes=2, dependents_at_start=True, fold=2),  # two outputs a thread
    SplitKTactic(16, 16, 1, 7, k_boxes=2, fold=4),
    # Split K, its reduction vectors 4 wide: a gate pair and its up pair per vector. 3072 x 7168's 24-row folded
    # tiles gate as (48,16,2,11,2) at M = 1-16, and on the H200 as (48,32,2,9,2) at M = 32.
    SplitKTactic(48, 64, 2, 6, k_boxes=2),
    SplitKTactic(48, 16, 2, 11, k_boxes=2),
    SplitKTactic(48, 32, 2, 9, k_boxes=2),
    SplitKTactic(128, 32, 4, 5),
    # What a weight-as-B tactic that cannot gate becomes at M = 256: one activation tile covering the batch, split
    # where it fills the SMs.
    SplitKTactic(64, 256, 2, 5),
    SplitKTactic(64, 256, 1, 5),
    # The weight as B: a gate row's and its up row's sums in neighbouring 8-column blocks (the H100 tables' M = 256
    # tactics of the gate/up pairs, staged; three warpgroups over 192 activation rows).
    SplitKTactic(128, 128, 1, 7, multicast=2, weight_as_b=True),
    SplitKTactic(48, 128, 1, 5, k_boxes=2, multicast=2, weight_as_b=True),
    SplitKTactic(64, 192, 1, 7, weight_as_b=True),
]
