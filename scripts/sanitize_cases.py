"""Small projections and glue kernels for compute-sanitizer (memcheck, racecheck, synccheck, initcheck).

Every feature of the projection kernel (decode_projection/kernel/splitk.py) and of the glue kernels (glue.py, norm.py,
activation.py) has at least one case here: ``FEATURES`` and ``GLUE_FEATURES`` name them, each with the test a
case must pass to have it, and tests/test_sanitize_cases_cpu.py checks that every case is valid, that every
feature has a case and that every case compiles for sm_90a. Shapes are small: the sanitizers run kernels 10-100x
slower. Each output is checked on the CPU against float64, so the only kernels the sanitizer sees on the GPU are
ours (and PyTorch's random and constant fills).

    python scripts/sanitize_cases.py [SELECTOR ...]                 # run on the GPU, under compute-sanitizer
    python scripts/sanitize_cases.py --compile-only [SELECTOR ...]  # compile only (fills the disk cache)
    python scripts/sanitize_cases.py --list [SELECTOR ...]          # each case and its features

A selector is an index into CASES (indices never change: new cases go at the end), ``split`` (every projection
case with split K), ``projections`` (every projection case), ``glue`` (every glue case) or a glue op
(``pdl_glue``, ``rms_norm``, ``fused_add_rms_norm``, ``silu_and_mul``, ``chain``); none selects every case.
"""

import sys
from typing import NamedTuple

import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.kernel.splitk import SplitKGemm
from decode_projection.kernel.tactic import ceil_div
from decode_projection.projection import OUTPUT_DTYPES

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
ARCH = "sm_90a"


class Case(NamedTuple):
    """One projection: its tactic, N (weight rows), K and the batch M, the weight's and the output's dtypes, and its
    epilogue: a bias of ``bias_dtype`` (None: none) and a residual ("none", "in place": the output itself, or
    "apart": a tensor of its own row pitch)."""

    tactic: SplitKTactic
    n: int
    k: int
    batch: int
    weight_dtype: torch.dtype = BF16
    output_dtype: torch.dtype = BF16
    bias_dtype: torch.dtype | None = None
    residual: str = "none"
    gated: bool = False  # N gate rows and N up rows, interleaved (projection.interleave_gate_up)

    @property
    def label(self) -> str:
        dtypes = "" if (self.weight_dtype, self.output_dtype) == (BF16, BF16) else \
            f" {str(self.weight_dtype)[6:]}->{str(self.output_dtype)[6:]}"
        bias = f" bias {str(self.bias_dtype)[6:]}" if self.bias_dtype is not None else ""
        residual = f" residual {self.residual}" if self.residual != "none" else ""
        gated = " gated" if self.gated else ""
        return f"{self.tactic.label} {self.n}x{self.k} M={self.batch}{dtypes}{bias}{residual}{gated}"

    @property
    def epilogue(self) -> str:
        """How the kernel stores this case's output (SplitKGemm.consume): folded, staged, direct or reduction."""
        t = self.tactic
        if t.fold > 1:
            return "folded"
        if SplitKGemm(t).stages_output(OUTPUT_DTYPES[self.output_dtype]):
            return "staged"
        return "direct" if t.split == 1 else "reduction"

    @property
    def epilogue_code(self):
        """The kernel's epilogue (projection.Epilogue): what it adds before rounding."""
        from decode_projection.projection import Epilogue

        return Epilogue(self.residual != "none", self.bias_dtype, self.gated)

    @property
    def vector_stores(self) -> bool:
        """Whether the staged epilogue stores 16 bytes at a time: a 16-byte output pitch (N here; the output is a
        fresh tensor, so its base is aligned) or a single row (SplitKGemm.store_staged)."""
        return self.n % 8 == 0 or self.batch == 1

    @property
    def moved_back(self) -> bool:
        """Whether the last activation tile moves back to end at row M (SplitKGemm.activation_origin)."""
        return self.batch > self.tactic.activation_rows and self.batch % self.tactic.activation_rows != 0

    @property
    def empty_rank(self) -> bool:
        """Whether a split rank has no K tiles to consume."""
        t = self.tactic
        return t.split > 1 and any(t.k_slice(self.k, rank).stages == 0 for rank in range(t.split))

    @property
    def weight_rows(self) -> int:
        """N of the weight the kernel streams: a gated case's gate and up rows, interleaved in whole groups."""
        return 2 * ceil_div(self.n, 8) * 8 if self.gated else self.n

    @property
    def padded(self) -> bool:
        """Whether the weight-as-A tile is padded to whole 64-row warpgroup tiles (unfolded)."""
        return self.tactic.fold == 1 and self.tactic.weight_smem_rows > self.tactic.weight_rows


def _split(case):
    return case.tactic.split > 1


# Each feature of the projection kernel and what a case needs to have it.
FEATURES = {
    "split K over 8 ranks": lambda c: c.tactic.split == 8,
    "2 K boxes per stage": lambda c: c.tactic.k_boxes == 2,
    "4 K boxes per stage": lambda c: c.tactic.k_boxes == 4,
    "K folded, fold 2": lambda c: c.tactic.fold == 2,
    "K folded, fold 4": lambda c: c.tactic.fold == 4,
    "split-K partials in a buffer of their own": lambda c: _split(c) and c.tactic.reduction_buffered,
    "split-K partials in the drained stages": lambda c: _split(c) and not c.tactic.reduction_buffered,
    "own partials kept in registers": lambda c: _split(c) and c.tactic.keeps_own_partials,
    "own partials sent (three or more warpgroups)": lambda c: _split(c) and not c.tactic.keeps_own_partials,
    "own partials sent, buffer of their own": lambda c: (
        _split(c) and not c.tactic.keeps_own_partials and c.tactic.reduction_buffered),
    "partials 16 bytes a DSMEM store": lambda c: _split(c) and c.tactic.reduction_vector == 4,
    "partials 8 bytes a DSMEM store": lambda c: _split(c) and c.tactic.reduction_vector == 2,
    "partials 4 bytes a DSMEM store": lambda c: _split(c) and c.tactic.reduction_vector == 1,
    "a split rank with no K tiles": lambda c: c.empty_rank,
    "split K with multicast": lambda c: _split(c) and c.tactic.multicast > 1,
    "activations multicast to 2 weight tiles": lambda c: c.tactic.activation_sharers == 2,
    "activations multicast to 4 weight tiles": lambda c: c.tactic.activation_sharers == 4,
    "weight tiles past N (activation sharers)": lambda c: (
        c.tactic.grid_columns(c.weight_rows) // c.tactic.split > ceil_div(c.weight_rows, c.tactic.weight_rows)),
    "two column groups": lambda c: c.tactic.column_groups == 2,
    "three consumer warpgroups": lambda c: c.tactic.consumer_groups == 3,
    "four consumer warpgroups": lambda c: c.tactic.consumer_groups == 4,
    "registers handed over by a producer warpgroup": lambda c: c.tactic.reallocates_registers,
    "weight as B": lambda c: c.tactic.weight_as_b,
    "weight as B multicast to 2 activation tiles": lambda c: c.tactic.weight_sharers == 2,
    "weight as B multicast to 3 activation tiles": lambda c: c.tactic.weight_sharers == 3,
    "weight as B multicast to 4 activation tiles": lambda c: c.tactic.weight_sharers == 4,
    "weight as B multicast with split K": lambda c: c.tactic.weight_sharers > 1 and _split(c),
    "activation tiles past M (weight sharers)": lambda c: (
        c.tactic.grid_rows(c.batch) > ceil_div(c.batch, c.tactic.activation_rows)),
    "weight as B, split K": lambda c: c.tactic.weight_as_b and _split(c),
    "dependents let in at the start": lambda c: c.tactic.dependents_at_start,
    "dependents let in once the weights stream": lambda c: not c.tactic.dependents_at_start,
    "dependents at the start, staged epilogue": lambda c: c.tactic.dependents_at_start and c.epilogue == "staged",
    "dependents at the start, folded": lambda c: c.tactic.dependents_at_start and c.epilogue == "folded",
    "dependents at the start, weight as B": lambda c: c.tactic.dependents_at_start and c.tactic.weight_as_b,
    "padded weight tiles, direct stores": lambda c: c.padded and c.epilogue == "direct",
    "padded weight tiles, staged": lambda c: c.padded and c.epilogue == "staged",
    "padded weight tiles, split-K reduction": lambda c: c.padded and c.epilogue == "reduction",
    "padded weight tiles of three warpgroups": lambda c: c.padded and c.tactic.weight_smem_rows == 192,
    "direct stores": lambda c: c.epilogue == "direct",
    "staged output, 16-byte stores": lambda c: c.epilogue == "staged" and c.vector_stores,
    "staged output, element stores": lambda c: c.epilogue == "staged" and not c.vector_stores,
    "FP32 output, direct stores": lambda c: c.output_dtype == FP32 and c.epilogue == "direct",
    "FP32 output of 32+ activation rows (not staged)": lambda c: (
        c.output_dtype == FP32 and c.epilogue == "direct" and c.tactic.activation_rows >= 32),
    "FP32 output, split-K reduction": lambda c: c.output_dtype == FP32 and c.epilogue == "reduction",
    "FP32 output, folded": lambda c: c.output_dtype == FP32 and c.epilogue == "folded",
    "FP32 output, weight as B": lambda c: c.output_dtype == FP32 and c.tactic.weight_as_b,
    "FP16 weights, staged": lambda c: c.weight_dtype == FP16 and c.epilogue == "staged",
    "FP16 weights, split-K reduction": lambda c: c.weight_dtype == FP16 and c.epilogue == "reduction",
    "FP16 weights, folded": lambda c: c.weight_dtype == FP16 and c.epilogue == "folded",
    "FP16 weights, weight as B": lambda c: c.weight_dtype == FP16 and c.tactic.weight_as_b,
    "last activation tile moved back": lambda c: c.moved_back,
    "last activation tile moved back, split-K reduction": lambda c: c.moved_back and c.epilogue == "reduction",
    "last activation tile moved back, staged": lambda c: c.moved_back and c.epilogue == "staged",
    "last activation tile moved back, folded": lambda c: c.moved_back and c.epilogue == "folded",
    "last activation tile moved back, weight as B": lambda c: c.moved_back and c.tactic.weight_as_b,
    "FP16 output": lambda c: c.output_dtype == FP16,
    "bias, direct stores": lambda c: c.bias_dtype is not None and c.epilogue == "direct",
    "bias, staged": lambda c: c.bias_dtype is not None and c.epilogue == "staged",
    "bias, folded": lambda c: c.bias_dtype is not None and c.epilogue == "folded",
    "bias, split-K reduction": lambda c: c.bias_dtype is not None and c.epilogue == "reduction",
    "bias and residual, weight as B": lambda c: (
        c.bias_dtype is not None and c.residual != "none" and c.tactic.weight_as_b),
    "residual in place, direct stores": lambda c: c.residual == "in place" and c.epilogue == "direct",
    "residual in place, staged": lambda c: c.residual == "in place" and c.epilogue == "staged",
    "residual in place, split-K reduction": lambda c: c.residual == "in place" and c.epilogue == "reduction",
    "residual apart, staged, element stores": lambda c: (
        c.residual == "apart" and c.epilogue == "staged" and not c.vector_stores),
    "residual apart, folded": lambda c: c.residual == "apart" and c.epilogue == "folded",
    "residual apart, FP32 output, split-K reduction": lambda c: (
        c.residual == "apart" and c.output_dtype == FP32 and c.epilogue == "reduction"),
    "residual, last activation tile moved back": lambda c: c.residual != "none" and c.moved_back,
    "gated, direct stores": lambda c: c.gated and c.epilogue == "direct",
    "gated, staged": lambda c: c.gated and c.epilogue == "staged",
    "gated, padded weight tiles": lambda c: c.gated and c.padded,
    "gated, activations multicast": lambda c: c.gated and c.tactic.activation_sharers > 1,
    "gated, N not whole groups of 8": lambda c: c.gated and c.n % 8 != 0,
    "gated, folded": lambda c: c.gated and c.epilogue == "folded",
    "gated, folded, last activation tile moved back": lambda c: c.gated and c.epilogue == "folded" and c.moved_back,
    "gated, split-K reduction": lambda c: c.gated and c.epilogue == "reduction",
    "gated, split-K reduction of four ranks, FP32 output": lambda c: (
        c.gated and c.epilogue == "reduction" and c.tactic.split == 4 and c.output_dtype == FP32),
}

T = SplitKTactic
CASES = [
    Case(T(64, 8, 1, 4), 200, 1000, 5),
    Case(T(128, 32, 2, 4), 300, 1544, 40),
    Case(T(64, 16, 8, 3), 136, 520, 16),
    Case(T(64, 8, 2, 3, k_boxes=4), 200, 1000, 5),
    Case(T(128, 64, 4, 3, k_boxes=2), 136, 1544, 64),
    Case(T(64, 64, 2, 3, multicast=2), 300, 1544, 64),
    Case(T(128, 32, 1, 4, multicast=4), 520, 1000, 30),
    # A split rank with no K tiles (3 tiles over 4 ranks), and wide stages over a group past N.
    Case(T(64, 32, 4, 3, multicast=2), 200, 136, 20),
    Case(T(64, 64, 1, 3, k_boxes=2, multicast=4), 328, 1000, 64),
    # Three consumer warpgroups: split-K reduction over 384 threads, and multicast.
    Case(T(192, 64, 2, 3), 400, 1544, 50),
    Case(T(192, 32, 1, 4, multicast=2), 500, 1000, 32),
    # A producer warpgroup that hands its registers to three consumer warpgroups (256 activation rows).
    Case(T(192, 256, 4, 4), 400, 1544, 200),
    Case(T(192, 256, 1, 4, multicast=2), 500, 1000, 256),
    # Two consumer warpgroups splitting the activation tile, alone and with split K.
    Case(T(64, 256, 1, 4, column_groups=2), 200, 1000, 256),
    Case(T(64, 128, 4, 3, column_groups=2), 136, 1544, 100),
    # The weight as wgmma's B in tiles that are not a multiple of 64 rows: alone, and with split K and the weight
    # multicast to two or three activation tiles (the last one past M in the last two cases).
    Case(T(112, 128, 1, 4, weight_as_b=True), 300, 1000, 200),
    Case(T(48, 64, 3, 4, k_boxes=2, multicast=2, weight_as_b=True), 136, 1544, 100),
    Case(T(144, 128, 1, 4, multicast=2, weight_as_b=True), 300, 1000, 100),
    Case(T(96, 64, 1, 4, multicast=3, weight_as_b=True), 300, 1000, 100),
    # The weight as B with four consumer warpgroups of activations that take a producer warpgroup's registers,
    # four without, with split K, and three.
    Case(T(160, 256, 1, 4, weight_as_b=True), 500, 1000, 250),
    Case(T(128, 256, 2, 3, weight_as_b=True), 300, 1544, 200),
    Case(T(48, 192, 1, 7, weight_as_b=True), 136, 1000, 180),
    # Weight-as-A tiles padded to whole warpgroups: one and three warpgroups, with split K and multicast.
    Case(T(56, 8, 1, 6, k_boxes=2), 300, 1000, 3),
    Case(T(160, 32, 3, 3, multicast=2), 500, 1544, 40),
    # The staged epilogue: 16-byte stores, and element stores where N and the pitch are odd (padded tile).
    Case(T(64, 64, 1, 4), 328, 1000, 60),
    Case(T(56, 48, 1, 4, k_boxes=2), 301, 1000, 45),
    # Letting the next launch in as it starts, with the plain and the staged epilogue.
    Case(T(56, 16, 1, 5, k_boxes=4, dependents_at_start=True), 300, 1000, 12),
    Case(T(48, 64, 1, 7, k_boxes=2, dependents_at_start=True), 301, 1000, 50),
    # K folded into one warpgroup tile: two segments of an odd-row tile, and four where the last is all zero fill.
    Case(T(27, 8, 1, 5, k_boxes=4, dependents_at_start=True, fold=2), 300, 1000, 5),
    Case(T(12, 16, 1, 3, k_boxes=4, fold=4), 137, 520, 13),
    # The last activation tile moved back to end at row M (its first rows are the tile before's): with the
    # split-K reduction, the staged epilogue and K folded.
    Case(T(64, 32, 2, 4), 200, 1000, 77),
    Case(T(56, 48, 1, 4, k_boxes=2), 301, 1000, 100),
    Case(T(24, 16, 1, 4, k_boxes=2, fold=2), 137, 1000, 21),
    # Split-K partials in the drained stages of a pipeline that fills shared memory, then in a buffer of their own
    # beside the stages (one CTA per SM either way; case 1 has one too): with multicast (a rank with no K tiles),
    # with the weight as B multicast to two activation tiles.
    Case(T(64, 8, 3, 25), 200, 1544, 5),
    Case(T(64, 32, 4, 10, multicast=2), 200, 136, 20),
    Case(T(48, 64, 3, 6, k_boxes=2, multicast=2, weight_as_b=True), 136, 1544, 100),
    # FP32 output: the split-K reduction (a buffer of its own), 64 activation rows stored directly where 16-bit
    # outputs are staged, K folded, and the weight as B multicast to three activation tiles (the last moved back).
    Case(T(64, 16, 4, 4), 200, 1000, 12, output_dtype=FP32),
    Case(T(64, 64, 1, 4), 328, 1000, 60, output_dtype=FP32),
    Case(T(28, 8, 1, 5, k_boxes=4, fold=2), 300, 1000, 5, output_dtype=FP32),
    Case(T(96, 64, 1, 4, multicast=3, weight_as_b=True), 300, 1000, 150, output_dtype=FP32),
    # FP16 weights: staged with 16-byte stores, split K with multicast, the weight as B with split K and a rank
    # with no K tiles (FP32 output), and four folded segments let in at the start.
    Case(T(64, 64, 1, 4), 256, 1000, 64, weight_dtype=FP16),
    Case(T(64, 32, 2, 4, multicast=2), 200, 1544, 20, weight_dtype=FP16),
    Case(T(48, 64, 4, 4, weight_as_b=True), 200, 136, 100, weight_dtype=FP16, output_dtype=FP32),
    Case(T(16, 8, 1, 4, k_boxes=2, dependents_at_start=True, fold=4), 100, 1000, 8, weight_dtype=FP16),
    # Three consumer warpgroups whose partials all go through a buffer of their own (none kept in registers).
    Case(T(192, 8, 2, 4), 400, 1544, 6),
    # The weight as B: let in at the start (staged), multicast to three activation tiles with split K, and to four.
    Case(T(112, 64, 1, 4, weight_as_b=True, dependents_at_start=True), 304, 1000, 100),
    Case(T(96, 64, 2, 4, multicast=3, weight_as_b=True), 200, 1544, 150),
    Case(T(128, 64, 1, 4, multicast=4, weight_as_b=True), 300, 1000, 200),
    # Epilogues: a bias and a residual summed before the one rounding, on every store path (the residual the
    # output itself, or a tensor of its own row pitch), the last activation tile moved back in three of them.
    Case(T(64, 8, 1, 4), 200, 1000, 5, bias_dtype=FP32, residual="in place"),
    Case(T(64, 64, 1, 4), 328, 1000, 60, bias_dtype=BF16, residual="in place"),
    Case(T(56, 48, 1, 4, k_boxes=2), 301, 1000, 100, residual="apart"),
    Case(T(24, 16, 1, 4, k_boxes=2, fold=2), 137, 1000, 21, bias_dtype=FP32, residual="apart"),
    Case(T(64, 32, 2, 4), 200, 1000, 77, bias_dtype=BF16, residual="in place"),
    Case(T(64, 16, 4, 4), 200, 1000, 12, output_dtype=FP32, bias_dtype=FP32, residual="apart"),
    Case(T(96, 64, 1, 4, multicast=3, weight_as_b=True), 300, 1000, 150, weight_dtype=FP16, output_dtype=FP16,
         bias_dtype=FP16, residual="in place"),
    Case(T(192, 8, 2, 4), 400, 1544, 6, residual="in place"),
    # Gated: silu(gate) * up of gate and up rows interleaved eight at a time; direct stores (a padded 32-row tile,
    # N not whole groups of 8), staged (a padded 48-row tile, the last activation tile moved back), multicast.
    Case(T(32, 8, 1, 12, k_boxes=2), 150, 1000, 5, gated=True),
    Case(T(48, 64, 1, 7, k_boxes=2), 200, 1000, 100, gated=True),
    Case(T(64, 64, 1, 3, multicast=2), 260, 1000, 64, output_dtype=FP32, gated=True),
    # Gated split K: each rank's vector holds a gate pair and its up pair (ragged N and K, two activation tiles).
    Case(T(48, 16, 2, 11, k_boxes=2), 200, 1000, 12, gated=True),
    Case(T(128, 32, 4, 5), 300, 1544, 40, output_dtype=FP32, gated=True),
    # A weight-as-B tactic's gated nearest at M = 256: one activation tile over the batch, split in two.
    Case(T(64, 256, 2, 5), 100, 1000, 250, gated=True),
    # Gated with the weight as B: a gate row and its up row in neighbouring 8-column blocks; staged, and direct.
    Case(T(48, 128, 1, 5, k_boxes=2, multicast=2, weight_as_b=True), 100, 1000, 250, gated=True),
    Case(T(64, 192, 1, 7, weight_as_b=True), 70, 1000, 190, output_dtype=FP32, gated=True),
    # Gated and folded: each output's gate and up partials summed through shared memory (a whole slot of two groups
    # with the early start, N not whole groups of 8; one group in a slot of 16, the last activation tile moved back).
    Case(T(32, 8, 1, 11, k_boxes=2, dependents_at_start=True, fold=2), 150, 1000, 5, gated=True),
    Case(T(16, 16, 1, 7, k_boxes=2, fold=4), 40, 1000, 20, output_dtype=FP32, gated=True),
]
del T


class GlueCase(NamedTuple):
    """One glue kernel launch: the op, the dtype, rows and width (H; N for silu_and_mul, whose input is 2N; the
    hidden size of ``chain``), and whether the outputs replace the inputs."""

    op: str
    dtype: torch.dtype
    batch: int
    width: int
    in_place: bool = False

    @property
    def label(self) -> str:
        return f"{self.op} {str(self.dtype)[6:]} {self.batch}x{self.width}{' in place' if self.in_place else ''}"

    @property
    def vectors(self) -> int:
        """16-byte vectors of one row (of the output, for silu_and_mul)."""
        return self.width // 8


GLUE_OPS = ("pdl_glue", "rms_norm", "fused_add_rms_norm", "silu_and_mul", "chain")
# The chain: fused_add_rms_norm -> projection (gate and up) -> silu_and_mul -> projection (down), every launch
# with programmatic dependent launch; the gate_up projection splits K, the down projection lets the next in early.
CHAIN_INTERMEDIATE = 136
CHAIN_TACTICS = (SplitKTactic(64, 8, 2, 4), SplitKTactic(56, 8, 1, 4, dependents_at_start=True))

GLUE_FEATURES = {
    "PDL copy (glue.py), a partial last CTA": lambda g: g.op == "pdl_glue" and g.batch * g.vectors % 256 != 0,
    "PDL copy (glue.py), FP16": lambda g: g.op == "pdl_glue" and g.dtype == FP16,
    "rms_norm, fewer vectors than threads": lambda g: g.op == "rms_norm" and g.vectors < 128,
    "rms_norm, several vectors a thread": lambda g: g.op == "rms_norm" and g.vectors > 2 * 128,
    "rms_norm in place": lambda g: g.op == "rms_norm" and g.in_place,
    "rms_norm, FP16": lambda g: g.op == "rms_norm" and g.dtype == FP16,
    "fused_add_rms_norm": lambda g: g.op == "fused_add_rms_norm" and not g.in_place,
    "fused_add_rms_norm in place": lambda g: g.op == "fused_add_rms_norm" and g.in_place,
    "fused_add_rms_norm, FP16": lambda g: g.op == "fused_add_rms_norm" and g.dtype == FP16,
    "silu_and_mul, one partial CTA a row": lambda g: g.op == "silu_and_mul" and g.vectors < 128,
    "silu_and_mul, several CTAs a row, the last partial": lambda g: (
        g.op == "silu_and_mul" and g.vectors > 128 and g.vectors % 128 != 0),
    "silu_and_mul, FP16": lambda g: g.op == "silu_and_mul" and g.dtype == FP16,
    "glue and projections chained under PDL": lambda g: g.op == "chain",
}

GLUE_CASES = [
    GlueCase("pdl_glue", BF16, 5, 1544),
    GlueCase("pdl_glue", FP16, 1, 8),
    GlueCase("rms_norm", BF16, 3, 1000),
    GlueCase("rms_norm", FP16, 2, 7168),
    GlueCase("rms_norm", BF16, 4, 1544, in_place=True),
    GlueCase("fused_add_rms_norm", BF16, 3, 1544),
    GlueCase("fused_add_rms_norm", FP16, 2, 1000, in_place=True),
    GlueCase("silu_and_mul", BF16, 3, 1000),
    GlueCase("silu_and_mul", FP16, 2, 4224),
    GlueCase("chain", BF16, 5, 520),
]


def case_features(case) -> list[str]:
    """The features ``case`` (a projection or a glue case) has."""
    features = GLUE_FEATURES if isinstance(case, GlueCase) else FEATURES
    return [name for name, has in features.items() if has(case)]


def select(selectors) -> list:
    """The cases ``selectors`` name (module docstring), in order, each once; every case where there are none."""
    if not selectors:
        return CASES + GLUE_CASES
    chosen = []
    for selector in selectors:
        if selector == "split":
            found = [case for case in CASES if case.tactic.split > 1]
        elif selector == "projections":
            found = CASES
        elif selector == "glue":
            found = GLUE_CASES
        elif selector in GLUE_OPS:
            found = [case for case in GLUE_CASES if case.op == selector]
        elif selector.isdigit() and int(selector) < len(CASES):
            found = [CASES[int(selector)]]
        else:
            raise SystemExit(f"sanitize_cases: {selector!r} is no case index (0-{len(CASES) - 1}), 'split', "
                             f"'projections', 'glue' or one of {', '.join(GLUE_OPS)}")
        chosen += [case for case in found if case not in chosen]
    return chosen


def compile_case(case, arch=ARCH) -> list:
    """Compile every kernel ``case`` launches, without a GPU; returns the compiled functions."""
    from decode_projection import activation, glue, norm
    from decode_projection.projection import compile_projection

    if isinstance(case, Case):
        return [compile_projection(case.tactic, case.output_dtype, arch, case.weight_dtype, True, case.epilogue_code)]
    if case.op == "pdl_glue":
        return [glue.compile_glue(case.dtype, arch)]
    if case.op in ("rms_norm", "fused_add_rms_norm"):
        return [norm.compile_rms_norm(case.dtype, case.op == "fused_add_rms_norm", arch)]
    if case.op == "silu_and_mul":
        return [activation.compile_silu_and_mul(case.dtype, arch)]
    assert case.op == "chain", case
    return [norm.compile_rms_norm(case.dtype, True, arch), activation.compile_silu_and_mul(case.dtype, arch)] + [
        compile_projection(tactic, case.dtype, arch, case.dtype) for tactic in CHAIN_TACTICS]


def host_copy(tensor):
    """A copy of ``tensor`` in host memory, kept as it is now (an in-place kernel may overwrite ``tensor``)."""
    return tensor.to("cpu", copy=True)


def run_projection(case: Case) -> str:
    """Launch one projection into a NaN-filled output and check it against float64 on the CPU."""
    from decode_projection.measure.checks import GatedReference, assert_close_to_reference
    from decode_projection.projection import interleave_gate_up

    weight = torch.randn(case.n, case.k, device="cuda", dtype=case.weight_dtype)
    x = torch.randn(case.batch, case.k, device="cuda", dtype=case.weight_dtype)
    out = torch.full((case.batch, case.n), float("nan"), device="cuda", dtype=case.output_dtype)
    bias = None if case.bias_dtype is None else torch.randn(case.n, device="cuda", dtype=case.bias_dtype)
    residual = None
    if case.residual == "in place":
        residual = out.copy_(torch.randn(case.batch, case.n, device="cuda"))
    elif case.residual == "apart":
        residual = torch.randn(case.batch, case.n + 24, device="cuda", dtype=case.output_dtype)[:, 8 : 8 + case.n]
    addend = None
    if bias is not None or residual is not None:
        addend = torch.zeros(1, case.n, dtype=torch.float64)
        addend = addend + (0 if bias is None else bias.cpu().double()[None, :])
        addend = addend + (0 if residual is None else host_copy(residual).double())
    if case.gated:
        up = torch.randn(case.n, case.k, device="cuda", dtype=case.weight_dtype)
        projection = PreparedProjection(interleave_gate_up(weight, up), {case.batch: case.tactic},
                                        output_dtype=case.output_dtype, gated_rows=case.n).prepare()
        projection.run(x, out)
        torch.cuda.synchronize()
        error = GatedReference(x.cpu(), weight.cpu(), up.cpu(), case.output_dtype).check(out.cpu(), case.label)
        return f"relative error {error:.2e}"
    projection = PreparedProjection(weight, {case.batch: case.tactic}, output_dtype=case.output_dtype, bias=bias,
                                    residual=case.residual != "none").prepare()
    projection.run(x, out, residual=residual)
    torch.cuda.synchronize()
    error = assert_close_to_reference(out.cpu(), x.cpu(), weight.cpu(), label=case.label, addend=addend)
    return f"relative error {error:.2e}"


def run_glue(case: GlueCase) -> str:
    """Launch one glue case (NaN-filled outputs where not in place) and check it on the CPU."""
    from decode_projection import activation, glue, norm
    from decode_projection.measure.checks import assert_close_to_reference
    from decode_projection.measure.ops_reference import (
        GlueReference, rms_norm_float64, silu_and_mul_float64, torch_rms_norm, torch_silu_and_mul,
    )

    def rows(width):
        return torch.randn(case.batch, width, device="cuda", dtype=case.dtype)

    def poisoned(width):
        return torch.full((case.batch, width), float("nan"), device="cuda", dtype=case.dtype)

    if case.op == "pdl_glue":
        source, x = rows(case.width), poisoned(case.width)
        glue.pdl_glue(source, x)()
        torch.cuda.synchronize()
        assert torch.equal(x.cpu(), source.cpu()), f"{case.label}: the copy differs"
        return "copied"
    if case.op == "rms_norm":
        x, weight = rows(case.width), torch.randn(case.width, device="cuda", dtype=case.dtype)
        given = host_copy(x)
        out = norm.rms_norm(x, weight, 1e-6, out=x if case.in_place else poisoned(case.width))
        torch.cuda.synchronize()
        weight = weight.cpu()
        error = GlueReference(rms_norm_float64(given, weight, 1e-6), torch_rms_norm(given, weight, 1e-6)).check(
            out.cpu(), case.label)
        return f"relative error {error:.2e}"
    if case.op == "fused_add_rms_norm":
        x, residual = rows(case.width), rows(case.width)
        weight = torch.randn(case.width, device="cuda", dtype=case.dtype)
        given, given_residual = host_copy(x), host_copy(residual)
        if case.in_place:  # vLLM's in-place form
            out, total = norm.fused_add_rms_norm(x, residual, weight, 1e-6, out=x, residual_out=residual)
        else:
            out, total = norm.fused_add_rms_norm(x, residual, weight, 1e-6, out=poisoned(case.width),
                                                 residual_out=poisoned(case.width))
        torch.cuda.synchronize()
        total, weight = total.cpu(), weight.cpu()
        assert torch.equal(total, given + given_residual), f"{case.label}: residual_out != x + residual"
        error = GlueReference(rms_norm_float64(total, weight, 1e-6), torch_rms_norm(total, weight, 1e-6)).check(
            out.cpu(), case.label)
        return f"relative error {error:.2e}"
    if case.op == "silu_and_mul":
        x = rows(2 * case.width)
        out = activation.silu_and_mul(x, out=poisoned(case.width))
        torch.cuda.synchronize()
        x = x.cpu()
        error = GlueReference(silu_and_mul_float64(x), torch_silu_and_mul(x)).check(out.cpu(), case.label)
        return f"relative error {error:.2e}"
    assert case.op == "chain", case
    hidden, intermediate = case.width, CHAIN_INTERMEDIATE
    x, residual = rows(hidden), rows(hidden)
    weight = torch.randn(hidden, device="cuda", dtype=case.dtype)
    gate_up_weight = torch.randn(2 * intermediate, hidden, device="cuda", dtype=case.dtype) / hidden**0.5
    down_weight = torch.randn(hidden, intermediate, device="cuda", dtype=case.dtype) / intermediate**0.5
    gate_up = PreparedProjection(gate_up_weight, {case.batch: CHAIN_TACTICS[0]}).prepare()
    down = PreparedProjection(down_weight, {case.batch: CHAIN_TACTICS[1]}).prepare()
    normed, total = poisoned(hidden), poisoned(hidden)
    gate_and_up, activated, out = poisoned(2 * intermediate), poisoned(intermediate), poisoned(hidden)
    given, given_residual = host_copy(x), host_copy(residual)
    torch.cuda.synchronize()  # the inputs are ready: from here on only our kernels, back to back
    norm.fused_add_rms_norm(x, residual, weight, 1e-6, out=normed, residual_out=total)
    gate_up.run(normed, gate_and_up)
    activation.silu_and_mul(gate_and_up, out=activated)
    down.run(activated, out)
    torch.cuda.synchronize()
    # Each step against float64 of the inputs it was given.
    total, normed, weight = total.cpu(), normed.cpu(), weight.cpu()
    gate_and_up, activated = gate_and_up.cpu(), activated.cpu()
    assert torch.equal(total, given + given_residual), f"{case.label}: residual_out != x + residual"
    GlueReference(rms_norm_float64(total, weight, 1e-6), torch_rms_norm(total, weight, 1e-6)).check(
        normed, f"{case.label}: the norm")
    assert_close_to_reference(gate_and_up, normed, gate_up_weight.cpu(), label=f"{case.label}: gate_up")
    GlueReference(silu_and_mul_float64(gate_and_up), torch_silu_and_mul(gate_and_up)).check(
        activated, f"{case.label}: silu_and_mul")
    error = assert_close_to_reference(out.cpu(), activated, down_weight.cpu(), label=f"{case.label}: down")
    return f"relative error {error:.2e} (down)"


def main(argv) -> None:
    """Run, compile or list the selected cases (module docstring)."""
    mode = argv[0] if argv and argv[0] in ("--compile-only", "--list") else None
    chosen = select(argv[1:] if mode else argv)
    for case in chosen:
        if mode == "--list":
            print(f"{case.label}: {'; '.join(case_features(case)) or '-'}")
        elif mode == "--compile-only":
            compile_case(case)
            print(f"{case.label}: compiled", flush=True)
        else:
            outcome = run_projection(case) if isinstance(case, Case) else run_glue(case)
            print(f"{case.label}: {outcome}", flush=True)
    if mode != "--list":
        print(f"{'compiled' if mode else 'ran'} {len(chosen)} cases")


if __name__ == "__main__":
    main(sys.argv[1:])
