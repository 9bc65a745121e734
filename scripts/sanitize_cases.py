"""A few small projections for compute-sanitizer (memcheck, racecheck): split 1, 2, 4 and 8; 1, 2 and 4 K boxes;
activations multicast to 2 and 4 weight tiles; 64, 128 and 192 weight rows (the last with 256 activation rows too);
two consumer warpgroups splitting the activation tile; the weight as wgmma's B, with one to four warpgroups of
activations, and multicast to 2 or 3 activation tiles; weight tiles padded to whole warpgroups; the unsplit epilogue
staged in shared memory, with and without 16-byte output stores; K folded; the last activation tile moved back
to end at row M; split-K partials in a buffer of their own and in the drained stages. Arguments, if any, are the
indices in CASES of the cases to run, or ``split`` for every case with split K."""

import sys

import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.measure.checks import assert_close_to_reference

CASES = [
    (SplitKTactic(64, 8, 1, 4), 200, 1000, 5),
    (SplitKTactic(128, 32, 2, 4), 300, 1544, 40),
    (SplitKTactic(64, 16, 8, 3), 136, 520, 16),
    (SplitKTactic(64, 8, 2, 3, k_boxes=4), 200, 1000, 5),
    (SplitKTactic(128, 64, 4, 3, k_boxes=2), 136, 1544, 64),
    (SplitKTactic(64, 64, 2, 3, multicast=2), 300, 1544, 64),
    (SplitKTactic(128, 32, 1, 4, multicast=4), 520, 1000, 30),
    # A split rank with no K tiles (3 tiles over 4 ranks), and wide stages over a group past N.
    (SplitKTactic(64, 32, 4, 3, multicast=2), 200, 136, 20),
    (SplitKTactic(64, 64, 1, 3, k_boxes=2, multicast=4), 328, 1000, 64),
    # Three consumer warpgroups: split-K reduction over 384 threads, and multicast.
    (SplitKTactic(192, 64, 2, 3), 400, 1544, 50),
    (SplitKTactic(192, 32, 1, 4, multicast=2), 500, 1000, 32),
    # A producer warpgroup that hands its registers to three consumer warpgroups (256 activation rows).
    (SplitKTactic(192, 256, 4, 4), 400, 1544, 200),
    (SplitKTactic(192, 256, 1, 4, multicast=2), 500, 1000, 256),
    # Two consumer warpgroups splitting the activation tile, alone and with split K.
    (SplitKTactic(64, 256, 1, 4, column_groups=2), 200, 1000, 256),
    (SplitKTactic(64, 128, 4, 3, column_groups=2), 136, 1544, 100),
    # The weight as wgmma's B in tiles that are not a multiple of 64 rows: alone, and with split K and the weight
    # multicast to two or three activation tiles (the last one past M in the last two cases).
    (SplitKTactic(112, 128, 1, 4, weight_as_b=True), 300, 1000, 200),
    (SplitKTactic(48, 64, 3, 4, k_boxes=2, multicast=2, weight_as_b=True), 136, 1544, 100),
    (SplitKTactic(144, 128, 1, 4, multicast=2, weight_as_b=True), 300, 1000, 100),
    (SplitKTactic(96, 64, 1, 4, multicast=3, weight_as_b=True), 300, 1000, 100),
    # The weight as B with four consumer warpgroups of activations that take a producer warpgroup's registers,
    # four without, with split K, and three.
    (SplitKTactic(160, 256, 1, 4, weight_as_b=True), 500, 1000, 250),
    (SplitKTactic(128, 256, 2, 3, weight_as_b=True), 300, 1544, 200),
    (SplitKTactic(48, 192, 1, 7, weight_as_b=True), 136, 1000, 180),
    # Weight-as-A tiles padded to whole warpgroups: one and three warpgroups, with split K and multicast.
    (SplitKTactic(56, 8, 1, 6, k_boxes=2), 300, 1000, 3),
    (SplitKTactic(160, 32, 3, 3, multicast=2), 500, 1544, 40),
    # The staged epilogue: 16-byte stores, and element stores where N and the pitch are odd (padded tile).
    (SplitKTactic(64, 64, 1, 4), 328, 1000, 60),
    (SplitKTactic(56, 48, 1, 4, k_boxes=2), 301, 1000, 45),
    # Letting the next launch in as it starts, with the plain and the staged epilogue.
    (SplitKTactic(56, 16, 1, 5, k_boxes=4, dependents_at_start=True), 300, 1000, 12),
    (SplitKTactic(48, 64, 1, 7, k_boxes=2, dependents_at_start=True), 301, 1000, 50),
    # K folded into one warpgroup tile: two segments of an odd-row tile, and four where the last is all zero fill.
    (SplitKTactic(27, 8, 1, 5, k_boxes=4, dependents_at_start=True, fold=2), 300, 1000, 5),
    (SplitKTactic(12, 16, 1, 3, k_boxes=4, fold=4), 137, 520, 13),
    # The last activation tile moved back to end at row M (its first rows are the tile before's): with the
    # split-K reduction, the staged epilogue and K folded.
    (SplitKTactic(64, 32, 2, 4), 200, 1000, 77),
    (SplitKTactic(56, 48, 1, 4, k_boxes=2), 301, 1000, 100),
    (SplitKTactic(24, 16, 1, 4, k_boxes=2, fold=2), 137, 1000, 21),
    # Split-K partials in the drained stages of a pipeline that fills shared memory, then in a buffer of their own
    # beside the stages (one CTA per SM either way; case 1 has one too): with multicast (a rank with no K tiles),
    # with the weight as B multicast to two activation tiles.
    (SplitKTactic(64, 8, 3, 25), 200, 1544, 5),
    (SplitKTactic(64, 32, 4, 10, multicast=2), 200, 136, 20),
    (SplitKTactic(48, 64, 3, 6, k_boxes=2, multicast=2, weight_as_b=True), 136, 1544, 100),
]

if sys.argv[1:] == ["split"]:
    chosen = [case for case in CASES if case[0].split > 1]
else:
    chosen = [CASES[int(i)] for i in sys.argv[1:]] or CASES
for tactic, n, k, batch in chosen:
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    PreparedProjection(weight, {batch: tactic}).prepare().run(x, out)
    torch.cuda.synchronize()
    # Checked on the CPU so the only kernels the sanitizer sees on the GPU are ours.
    error = assert_close_to_reference(out.cpu(), x.cpu(), weight.cpu(), label=str(tactic))
    print(f"{tactic}: relative error {error:.2e}")
