"""What one kernel configuration is and which ones can run: the tile, split K, the pipeline.

A tactic fixes everything the kernel's code depends on except the dtypes:
weight rows and activation rows per CTA, how many cluster CTAs split K, pipeline
stages and TMA boxes per stage, how many weight tiles share one activation load,
how many consumer warpgroups split the activation tile, which wgmma operand
the weight is, and when a launch lets the next one in. ``problems()`` is the one
validity predicate: the tuner, the tables, the heuristic and the kernel all ask
it, so a tactic accepted anywhere can be built and launched.
"""

import math
import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any, NamedTuple

from ..runtime.sm90 import (
    MOST_WGMMA_COLUMNS, PORTABLE_CLUSTER, QUARTER_REGISTERS, RESERVED_SMEM_PER_CTA, SMEM_CAPACITY, SMEM_PER_SM,
    WGMMA_ROWS,
)

BOX_K = 64  # K of one TMA box: 64 16-bit elements = one 128-byte swizzle row
K_BOXES = (1, 2, 4)  # boxes per stage along K: 128, 256 or 512 contiguous bytes of each weight row
WEIGHT_ROWS = (64, 128, 192)  # whole tiles of one to three consumer warpgroups (the heuristic's and pinned orders')
# With the weight as A a tile may also hold any multiple of 8 rows up to three warpgroups: its shared-memory
# tile is rounded up to whole 64-row warpgroup tiles, whose rows past the TMA box are never loaded and whose
# results are never stored. Such a tile lets the grid fill the SMs (7168 rows: 128 tiles of 56, where 64-row
# tiles give 112) without the 64-row activation tile, mostly TMA zero fill at small batches, that the weight
# as B needs (docs/padded-and-folded-tiles.md).
WEIGHT_ROWS_AS_A = tuple(range(8, WEIGHT_ROWS[-1] + 1, 8))
# Consumer warpgroups that share one 64-row weight tile, each owning a slice of the activation
# tile, so one's barrier waits overlap the other's wgmmas (one warpgroup kept the tensor pipe
# 64-70% busy at M=256, cuBLAS 83-87%). On the H200 two won where K <= 3584 and on 2112 x 7168,
# and lost up to 40% on the largest weights: the tuner keeps them where they win.
COLUMN_GROUPS = (1, 2)
# With the weight as wgmma's B: activation tiles of one to four warpgroups of 64 rows, and weight
# tiles of any wgmma N (a multiple of 8 up to 256, also the TMA box's limit). A tile of 192 or 256
# activation rows reads each weight byte into one CTA only, as the weight as A does.
ACTIVATION_ROWS_AS_A = (64, 128, 192, 256)
WEIGHT_ROWS_AS_B = tuple(range(8, MOST_WGMMA_COLUMNS + 1, 8))
# wgmma N. 48, 96 and 192 fit padded decode batches exactly: a 128- or 256-row tile
# taller than the batch (rows past M are TMA zero-fill) measured up to 1.6x slower.
ACTIVATION_ROWS = (8, 16, 32, 48, 64, 96, 128, 192, 256)
# K segments folded into one 64-row warpgroup tile: a weight tile of at most 64 / fold rows takes a slot
# of 64 / fold rows for each of ``fold`` K segments, and the activation tile one slot per segment, so
# one wgmma sums all segments at once (the cross-segment products are discarded). Narrow tiles that fill
# the SMs then keep a whole warpgroup tile of weight bytes in flight, without split K's reduction. The
# segments are a split of ``fold`` ranks' K slices, added in the same order: a fold sums as that split does.
FOLDS = (1, 2, 4)
# A folded tile may hold any number of rows up to its slot (tiles that fill the SMs: 3584 rows in 128 tiles of 28).
WEIGHT_ROWS_FOLDED = tuple(range(1, WGMMA_ROWS // FOLDS[1] + 1))
SPLITS = tuple(range(1, 9))  # 3, 5, 6 and 7 too: clusters need not be powers of two
# CTAs that share one load by TMA multicast: with the weight as A, neighbouring weight tiles share their activation
# tile; with the weight as B, neighbouring activation tiles share their weight tile, each CTA loading 1/multicast of
# its rows (a cluster of two 128-row activation tiles reads each weight byte from L2 once, cuBLAS's shape at M=256).
# Three share only a weight tile: three 64-row activation tiles cover M=192.
MULTICASTS = (1, 2, 3, 4)
# A launch gives every thread an even share of its SM quarter's QUARTER_REGISTERS (rounded down to 8). Where the
# consumers' accumulators outgrow it, a producer warpgroup keeps PRODUCER_REGISTERS and hands the rest of the CTA's
# registers to the consumer warpgroups (setmaxnreg, which waits for registers the CTA holds): 32 + 3 x 160 =
# 4 x 128 for three, 32 + 4 x 112 = 5 x 96 for four.
PRODUCER_REGISTERS = 32
# Accumulators per thread that four consumer warpgroups of 112 registers hold without spilling: 160 weight rows
# as B compiled clean for sm_90a, 176 spilled ~270 local-memory instructions.
MOST_PARTIALS_OF_FOUR_GROUPS = 80
BARRIER_BYTES = 1024  # mbarriers, rounded up to the 1024-byte tile alignment
POSITIONAL_FIELDS = 4  # the tile, the split and the stages; the fields after them are given by name
# A label: the numbers, then B (the weight as wgmma's B), E (dependents let in at the start), F and the fold.
_LABEL = re.compile(r"(?P<open>\()?(?P<numbers>\d+(?:,\d+){3,6})"
                    r"(?P<weight_as_b>,B)?(?P<early>,E)?(?:,F(?P<fold>\d+))?(?(open)\))")


def ceil_div(dividend, divisor):
    """How many ``divisor``-sized pieces cover ``dividend`` (Python integers)."""
    return -(-dividend // divisor)


class KSlice(NamedTuple):
    """The K tiles one CTA consumes, one pipeline stage each: Python integers, or the kernel's."""

    first: Any  # the first K tile of this split rank's slice
    stages: Any  # stages the CTA consumes: the slice's K tiles (none for ranks past the end of K)
    fold_stride: Any  # folded, K tiles between a stage's segments (0 unfolded)


@dataclass(frozen=True)
class SplitKTactic:
    """One kernel configuration: weight rows per CTA, activation rows per CTA, split K, stages,
    TMA boxes per stage along K, how many CTAs share each load of the operand they have in common, how many
    consumer warpgroups split the activation tile between them, whether the weight is
    wgmma's B operand (activations A) instead of A, and whether the launch lets the next
    (programmatic) launch in as it starts instead of once its weights are streamed."""

    weight_rows: int
    activation_rows: int
    split: int
    stages: int
    _: KW_ONLY
    k_boxes: int = 1
    multicast: int = 1
    column_groups: int = 1
    weight_as_b: bool = False
    dependents_at_start: bool = False
    fold: int = 1

    def to_dict(self) -> dict:
        """Every field by name: how tables and saved runs store a tactic."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_dict(cls, named: Mapping) -> "SplitKTactic":
        """The tactic ``to_dict`` gave (fields left out take their defaults), not yet checked (``as_tactic``)."""
        if not isinstance(named, Mapping):
            raise TypeError(f"a tactic by field name is a mapping, not {type(named).__name__}")
        unknown = sorted(set(named) - {field.name for field in fields(cls)})
        missing = [field.name for field in fields(cls)[:POSITIONAL_FIELDS] if field.name not in named]
        if unknown or missing:
            raise ValueError(f"tactic {dict(named)} has unknown fields {unknown} or lacks {missing}")
        return cls(**named)

    @classmethod
    def from_positions(cls, values) -> "SplitKTactic":
        """A tactic from its fields in declaration order, the trailing ones optional: the tuples of explicit
        policies, and the lists tables and saved runs held before they stored fields by name. Not yet checked."""
        names = [field.name for field in fields(cls)]
        if not POSITIONAL_FIELDS <= len(values) <= len(names):
            raise ValueError(f"a tactic has {POSITIONAL_FIELDS} to {len(names)} fields in order, got {tuple(values)}")
        return cls(**dict(zip(names, values)))

    @classmethod
    def from_label(cls, label: str) -> "SplitKTactic":
        """The tactic ``label`` names, parentheses optional; numbers after the stages may be left out where
        they are 1."""
        match = _LABEL.fullmatch(label.strip())
        if match is None:
            raise ValueError(f"{label!r} is not a tactic label such as (64,8,1,8,1,1,1,B,E,F2)")
        numbers = [int(number) for number in match["numbers"].split(",")]
        names = [field.name for field in fields(cls)][:len(numbers)]
        fold = int(match["fold"]) if match["fold"] else 1
        return cls(**dict(zip(names, numbers)), weight_as_b=bool(match["weight_as_b"]),
                   dependents_at_start=bool(match["early"]), fold=fold)

    @property
    def label(self) -> str:
        """The tactic's numbers in one token, then ``B`` where the weight is wgmma's B and ``E`` where
        the next launch is let in early (as this one starts), then ``F`` and the fold where K is folded."""
        numbers = [self.weight_rows, self.activation_rows, self.split, self.stages, self.k_boxes, self.multicast,
                   self.column_groups]
        flags = ["B"] * self.weight_as_b + ["E"] * self.dependents_at_start + [f"F{self.fold}"] * (self.fold > 1)
        return "(" + ",".join(map(str, numbers + flags)) + ")"

    @property
    def activation_sharers(self) -> int:
        """CTAs (of neighbouring weight tiles) that each load a share of one activation tile into all of them."""
        return 1 if self.weight_as_b else self.multicast

    @property
    def weight_sharers(self) -> int:
        """CTAs (of neighbouring activation tiles) that each load a share of one weight tile into all of them."""
        return self.multicast if self.weight_as_b else 1

    @property
    def weight_load_rows(self) -> int:
        """Weight rows of one TMA load: the rows of the weight map's box."""
        return self.weight_rows // self.weight_sharers

    @property
    def tile_k(self) -> int:
        """K of one pipeline stage."""
        return BOX_K * self.k_boxes

    @property
    def summation_order(self) -> tuple:
        """(split, k boxes): what fixes the K slices and so the order each output is summed in.

        Kept whole even at split 1 (where the stage width should not change the
        order): batch invariance is only claimed for what the GPU tests verify.
        For the same reason the weight as wgmma's B is an order of its own (a
        third entry): the tests verify invariance with the weight as A only, whose padded tiles sum every output
        as the whole tile does. A fold of F sums each output in the K slices of a split of F, adding them in the
        same order: it is that split's order.
        """
        if self.weight_as_b:
            return (self.split, self.k_boxes, "weight as B")
        return (self.split * self.fold, self.k_boxes)

    @property
    def tile_mnk(self) -> tuple[int, int, int]:
        """The CTA tile as wgmma sees it: (A rows, B rows, K)."""
        if self.weight_as_b:
            return (self.activation_rows, self.weight_rows, self.tile_k)
        return (self.weight_smem_rows, self.fold * self.activation_rows, self.tile_k)

    @property
    def slot_rows(self) -> int:
        """Shared-memory rows of one K segment's slot in a folded weight tile (the whole tile unfolded)."""
        return self.weight_smem_rows // self.fold

    @property
    def weight_smem_rows(self) -> int:
        """Rows of a weight tile in shared memory: with the weight as A, whole 64-row warpgroup tiles."""
        return self.weight_rows if self.weight_as_b else math.ceil(self.weight_rows / WGMMA_ROWS) * WGMMA_ROWS

    @property
    def consumer_groups(self) -> int:
        """Consumer warpgroups: one per 64 rows of A, times ``column_groups``."""
        return self.tile_mnk[0] // WGMMA_ROWS * self.column_groups

    @property
    def reallocates_registers(self) -> bool:
        """True where the consumers need more registers than an even share: three warpgroups of more than
        192 columns of B (~155 registers each at 256), four of more than 128 (90 at 128 fit the even 96)."""
        columns = self.tile_mnk[1]
        return (self.consumer_groups == 4 and columns > 128) or (self.consumer_groups == 3 and columns > 192)

    @property
    def consumer_registers(self) -> int:
        """Registers per consumer thread after a producer warpgroup hands its registers over (setmaxnreg)."""
        warps_per_quarter = math.ceil(self.threads / 128)
        at_launch = QUARTER_REGISTERS // (32 * warps_per_quarter) // 8 * 8
        share = (warps_per_quarter * at_launch - PRODUCER_REGISTERS) // self.consumer_groups
        return share // 8 * 8

    @property
    def wgmma_columns(self) -> int:
        """wgmma N: B's tile, or half of it where registers are reallocated (ptxas fits each
        instruction's accumulators in the 96-128 registers every thread starts with)."""
        columns = self.tile_mnk[1] // self.column_groups
        return columns // 2 if self.reallocates_registers else columns

    @property
    def threads(self) -> int:
        """Consumer warpgroups plus one producer warp (a whole warpgroup where registers are reallocated)."""
        return 128 * self.consumer_groups + (128 if self.reallocates_registers else 32)

    @property
    def stage_bytes(self) -> int:
        """Shared memory of one pipeline stage: a weight tile and an activation tile per folded K segment."""
        return (self.weight_smem_rows + self.fold * self.activation_rows) * self.tile_k * 2

    @property
    def stage_load_bytes(self) -> int:
        """Bytes the TMA loads of one stage write (the pipeline barrier's transaction count)."""
        return self.fold * (self.weight_rows + self.activation_rows) * self.tile_k * 2

    @property
    def fold_bytes(self) -> int:
        """Shared memory the folded epilogue sums its FP32 segment partials in: the drained pipeline buffers, which
        always hold them where the fold rules hold (tests/test_tactic_cpu.py)."""
        return self.weight_smem_rows * self.activation_rows * 4 if self.fold > 1 else 0

    @property
    def partials_per_thread(self) -> int:
        """FP32 accumulators each consumer thread holds (64 rows of A x its columns of B over 128 threads)."""
        return self.tile_mnk[1] // self.column_groups // 2

    @property
    def reduction_vector(self) -> int:
        """Accumulators per DSMEM store in the split-K reduction: 16-byte stores where every
        rank still owns a share (one 4-byte store per accumulator cost up to 2.7 us at M=256)."""
        for width in (4, 2):
            if self.partials_per_thread // width >= self.split:
                return width
        return 1

    @property
    def reduction_groups(self) -> int:
        """Vectors of ``reduction_vector`` accumulators each consumer thread hands over."""
        return self.partials_per_thread // self.reduction_vector

    @property
    def reduction_groups_per_rank(self) -> int:
        """Vectors each rank owns at most (vector g is rank g % split's): a slot's depth in the reduction's buffer."""
        return ceil_div(self.reduction_groups, self.split)

    @property
    def keeps_own_partials(self) -> bool:
        """Whether a split rank keeps the partials it owns in registers until it sums them, sending only its peers'
        (a slot fewer in the reduction's buffer). Not with three consumer warpgroups, whose accumulators leave too
        few registers: (192,192,6,4) spilled."""
        return self.consumer_groups < 3

    @property
    def reduction_slots(self) -> int:
        """Slots of partials an owner receives per vector: one per peer, and its own where it does not keep them."""
        return self.split - self.keeps_own_partials

    def reduction_slot(self, sender, owner):
        """The slot of the owner's buffer that ``sender``'s partials of a vector owned by ``owner`` land in (ranks,
        Python or kernel integers): each peer in turn after the owner where it keeps its own, else each rank's own."""
        if self.keeps_own_partials:
            return (sender + self.split - owner - 1) % self.split  # never negative: a kernel integer keeps the sign
        return sender

    @property
    def reduction_bytes(self) -> int:
        """Shared memory the split-K reduction needs: its own (``reduction_buffered``) or the drained pipeline
        buffers'."""
        if self.split == 1:
            return 0
        return (self.reduction_slots * self.reduction_groups_per_rank * self.reduction_vector * 128
                * self.consumer_groups * 4)

    @property
    def reduction_buffered(self) -> bool:
        """True where the split-K partials get shared memory of their own, beside the pipeline's stages: each rank
        then sends its partials as its loop ends, with no cluster barrier first (SplitKGemm.reduce_across_cluster).
        Only where the stages leave room without lowering how many CTAs fit on an SM: on the H200 the buffer took
        64-row tiles at M = 48-64 from two CTAs per SM to one and cost them 0.1-0.3 us back to back
        (docs/split-k-reduction.md)."""
        if self.split == 1:
            return False
        pipeline = BARRIER_BYTES + self.stages * self.stage_bytes
        buffered = pipeline + self.reduction_bytes
        return buffered <= SMEM_CAPACITY and resident_ctas(buffered) == resident_ctas(pipeline)

    def grid_columns(self, n, ceil_div=ceil_div):
        """CTAs along the launch grid's x for ``n`` weight rows: each weight tile's ``split`` ranks, the tiles in
        whole groups of activation sharers (those past N read zeros and store nothing). Python integers, or the
        kernel's with its ``ceil_div``."""
        weight_groups = ceil_div(ceil_div(n, self.weight_rows), self.activation_sharers)
        return weight_groups * self.activation_sharers * self.split

    def grid_rows(self, batch, ceil_div=ceil_div):
        """Activation tiles of the launch grid (its y) for ``batch``: whole groups of weight sharers (those past the
        batch reload the last tile's rows and store nothing). Python integers, or the kernel's with its ``ceil_div``."""
        return ceil_div(ceil_div(batch, self.activation_rows), self.weight_sharers) * self.weight_sharers

    def k_tiles(self, k, ceil_div=ceil_div):
        """Pipeline stages' worth of K (``tile_k`` columns each) in a weight of ``k`` columns, the last one partial
        (TMA zero fill past K)."""
        return ceil_div(k, self.tile_k)

    def k_slice(self, k, rank, *, ceil_div=ceil_div, minimum=min, maximum=max) -> KSlice:
        """The K tiles split rank ``rank`` consumes of a weight of ``k`` columns: a contiguous slice of
        ceil(K tiles / split), the last ranks' shorter or empty. Folded (split 1), stage i holds K tile i of every
        segment, segment s at s * the fold stride; the last segments' tiles past K are TMA zero fill. Python
        integers, or the kernel's with its ``ceil_div``, ``minimum`` and ``maximum``."""
        k_tiles = self.k_tiles(k, ceil_div)
        per_rank = ceil_div(k_tiles, self.split)
        first = rank * per_rank
        stages = maximum(minimum(per_rank, k_tiles - first), 0)
        if self.fold > 1:
            fold_stride = ceil_div(k_tiles, self.fold)
            return KSlice(first, fold_stride, fold_stride)
        return KSlice(first, stages, 0)

    @property
    def smem_bytes(self) -> int:
        """Shared memory per CTA."""
        return BARRIER_BYTES + self.stages * self.stage_bytes + self.reduction_bytes * self.reduction_buffered

    def problems(self) -> list[str]:
        """Why this tactic cannot run (empty when it can): the one validity predicate."""
        # Exactly int or bool: the kernel's code is specialized on these values, and the DSL takes no others
        # (a NumPy integer or a float failed only inside the compiler).
        mistyped = [f"{field.name} {getattr(self, field.name)!r} is not {field.type.__name__}"
                    for field in fields(self) if type(getattr(self, field.name)) is not field.type]
        if mistyped:
            return mistyped
        choices = {
            "weight rows": (self.weight_rows, WEIGHT_ROWS_AS_B if self.weight_as_b
                            else WEIGHT_ROWS_FOLDED if self.fold > 1 else WEIGHT_ROWS_AS_A),
            "activation rows": (self.activation_rows, ACTIVATION_ROWS_AS_A if self.weight_as_b else ACTIVATION_ROWS),
            "split": (self.split, SPLITS),
            "k boxes": (self.k_boxes, K_BOXES),
            "multicast": (self.multicast, MULTICASTS),
            "column groups": (self.column_groups, COLUMN_GROUPS),
            "weight as b": (self.weight_as_b, (False, True)),
            "dependents at start": (self.dependents_at_start, (False, True)),
            "fold": (self.fold, FOLDS),
        }
        found = [f"{name} {value} not in {allowed}" for name, (value, allowed) in choices.items() if value not in allowed]
        if self.stages < 2:
            found.append(f"stages {self.stages} < 2")
        if found:
            return found
        if self.split * self.multicast > PORTABLE_CLUSTER:
            found.append(f"cluster of split {self.split} x multicast {self.multicast} > {PORTABLE_CLUSTER} CTAs")
        if self.dependents_at_start and self.split * self.multicast > 1:
            # Measured, not a limit of the hardware: clusters lost up to 2.9 us that way (docs/programmatic-launch.md).
            found.append("only unclustered launches (split 1, multicast 1) let the next launch in as they start")
        if self.activation_sharers == 3:
            found.append("three CTAs share only a weight tile (the weight as B), not an activation tile")
        if self.activation_rows % (8 * self.activation_sharers):
            found.append(f"{self.activation_rows} activation rows do not split into {self.multicast} loads of 8n rows")
        if self.weight_sharers > 1 and self.weight_rows % (8 * self.weight_sharers):
            found.append(f"{self.weight_rows} weight rows do not split into {self.multicast} loads of 8n rows")
        if self.column_groups > 1 and (self.weight_as_b or self.weight_rows != WGMMA_ROWS or self.activation_rows < 128):
            found.append("column groups split only 64-row weight tiles of 128 or more activation rows, "
                         "with the weight as A")
        if self.fold > 1 and (self.weight_as_b or self.split > 1 or self.multicast > 1 or self.column_groups > 1
                              or self.weight_rows > WGMMA_ROWS // self.fold
                              or self.fold * self.activation_rows > ACTIVATION_ROWS[-1]):
            found.append(f"a fold of {self.fold} takes the weight as A in one slot of {WGMMA_ROWS // self.fold} rows, "
                         f"unsplit, without multicast or column groups, and {self.fold} x the activation rows "
                         f"<= {ACTIVATION_ROWS[-1]}")
        if self.reallocates_registers and self.tile_mnk[1] % 16:
            found.append(f"{self.tile_mnk[1]} columns of B do not halve into wgmma's N (a multiple of 8) "
                         "where registers are reallocated")
        if self.consumer_groups == 4 and self.partials_per_thread > MOST_PARTIALS_OF_FOUR_GROUPS:
            found.append(f"four consumer warpgroups hold at most {MOST_PARTIALS_OF_FOUR_GROUPS} accumulators "
                         f"per thread, not {self.partials_per_thread}")
        if self.smem_bytes > SMEM_CAPACITY:
            found.append(f"{self.smem_bytes} B of shared memory > {SMEM_CAPACITY}")
        if not self.reduction_buffered and self.reduction_bytes > self.stages * self.stage_bytes:
            found.append(
                f"split-K reduction needs {self.reduction_bytes} B, more than the "
                f"{self.stages * self.stage_bytes} B of pipeline buffers it reuses"
            )
        return found

    @property
    def valid(self) -> bool:
        """True when the kernel can be built and launched with this tactic."""
        return not self.problems()


def resident_ctas(smem_bytes: int, smem_per_sm: int = SMEM_PER_SM) -> int:
    """How many CTAs of ``smem_bytes`` shared memory one SM holds at once (at least one)."""
    return max(1, smem_per_sm // (smem_bytes + RESERVED_SMEM_PER_CTA))


def stored_tactic(value) -> SplitKTactic:
    """A SplitKTactic from a tactic, its fields by name (``to_dict``) or in order (``from_positions``), unchecked:
    what a table or a saved run holds, which may name tactics the kernel no longer takes."""
    if isinstance(value, SplitKTactic):
        return value
    if isinstance(value, Mapping):
        return SplitKTactic.from_dict(value)
    if isinstance(value, (list, tuple)):
        return SplitKTactic.from_positions(value)
    raise TypeError(f"a tactic is a SplitKTactic, a dict of its fields or a tuple of them, not {value!r}")


def as_tactic(tactic) -> SplitKTactic:
    """A SplitKTactic the kernel takes, from a tactic, a dict of its fields or a tuple of them in order
    (weight rows, activation rows, split, stages[, k boxes[, multicast[, column groups[, weight as b[,
    dependents at start[, fold]]]]]]); a ValueError says why not."""
    tactic = stored_tactic(tactic)
    problems = tactic.problems()
    if problems:
        raise ValueError(f"invalid split-K tactic {tactic}: {'; '.join(problems)}")
    return tactic


def max_stages(weight_rows: int, activation_rows: int, split: int, k_boxes: int = 1, *, weight_as_b=False,
               fold=1) -> int:
    """The deepest pipeline that fits in shared memory (``weight_as_b``: the weight tile is not padded)."""
    probe = SplitKTactic(weight_rows, activation_rows, split, 1, k_boxes=k_boxes, weight_as_b=weight_as_b, fold=fold)
    return (SMEM_CAPACITY - BARRIER_BYTES) // probe.stage_bytes


# A gated weight interleaves 8 gate rows and their 8 up rows: wgmma gives each thread the sums of rows r and r + 8
# of its warp's 16 (the accumulator's second mode) with the weight as A, and of columns c and c + 8 (its third
# mode, 8-column blocks) with the weight as B, so gate and up of one output meet in one thread.
GATE_GROUP_ROWS = 16


def gated_problems(tactic: SplitKTactic) -> list[str]:
    """Why ``tactic`` cannot run a gated projection (SplitKGemm's ``gated``), if it cannot: each output's gate sum
    and, eight rows below, its up sum must meet in one thread, in tiles of whole 16-row interleave groups; split, in
    one reduction vector, which then holds a gate pair and its up pair (the weight as A only). A folded tile sums
    its segments through shared memory, where the thread that stores an output reads both."""
    problems = []
    if tactic.weight_as_b and tactic.split > 1:
        # As B a gate row's accumulators and its up row's are in neighbouring 8-column blocks, so in different
        # reduction vectors, summed by different ranks.
        problems.append("split K with the weight as B reduces a gate row's sums and its up row's on different ranks")
    if tactic.split > 1 and tactic.reduction_vector != 4:
        # Vector g holds accumulators 4g..4g+3: columns m and m + 1 of rows n and n + 8, gate and up.
        problems.append(f"split K reduces vectors of {tactic.reduction_vector} accumulators, which part a gate row's "
                        "sums from its up row's (4 keep them together: at least 4 per rank)")
    if tactic.weight_rows % GATE_GROUP_ROWS:
        problems.append(f"weight rows {tactic.weight_rows} are not whole groups of {GATE_GROUP_ROWS}")
    elif tactic.weight_as_b and tactic.wgmma_columns % GATE_GROUP_ROWS:
        problems.append(f"wgmma's {tactic.wgmma_columns} weight rows are not whole groups of {GATE_GROUP_ROWS}")
    return problems
