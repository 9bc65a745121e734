"""A tile-contiguous weight layout for the start-up probe: does a stage whose bytes are contiguous land sooner?

After a plain kernel each CTA's first stage lands only when most of its window has (docs/launch-contexts.md): a
stage gathers one 128-byte box column from every row of its weight tile, and the next stages the following bytes
of the same rows. Here the weight is copied so that each (tile rows x 64 columns) box is one contiguous block,
tile after tile, K-major inside a tile:

    tiled[(n // R) * K / 64 * R + (k // 64) * R + n % R, k % 64] = weight[n, k]      (R: the tile's rows)

and read through an ordinary 2-D map of that [N * K / 64, 64] matrix with the same (64, R) box, so a stage's
shared-memory image is the one the kernel reads today: only the producer's coordinates change. A probe, not the
library's kernel: weight as A, unfolded, unshared weight tiles, N a multiple of the tile's rows, K of a stage's
columns (``tiling_problems``).

Layouts (``LAYOUTS``): ``tiles`` loads each box of that copy by TMA through a tensor map, as the kernel does;
``bulk`` loads it with one 1-D bulk copy (``cp.async.bulk``, no tensor map, as the read ceiling does) from a copy
whose 16-byte chunks are stored in the order the 128-byte swizzle puts them in shared memory (``pre_swizzled``),
so the stage's image is again the kernel's.
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.experimental.primitives import nvvm_wrapper as nvvm

from decode_projection.kernel.splitk import EVICT_FIRST
from decode_projection.kernel.tactic import BOX_K

LAYOUTS = ("tiles", "bulk")
ELEMENT_BYTES = 2  # BF16 and FP16 weights
ROW_BYTES = BOX_K * ELEMENT_BYTES  # one row of a box: the span the 128-byte swizzle permutes
SWIZZLE_ROWS = 8  # the swizzle moves 16-byte chunk c of shared-memory row r to c ^ (r % 8)
CHUNKS_PER_ROW = ROW_BYTES // 16


def tiling_problems(tactic, n: int, k: int) -> list[str]:
    """Why ``tactic`` on an ``n`` x ``k`` weight cannot read the tile-contiguous copy (empty when it can)."""
    found = []
    if tactic.weight_as_b or tactic.fold > 1 or tactic.weight_sharers > 1:
        found.append("the weight as A, unfolded, each CTA loading its own weight tile")
    if n % tactic.weight_load_rows:
        found.append(f"N {n} a multiple of the tile's {tactic.weight_load_rows} rows")
    if k % tactic.tile_k:
        # A last stage past K would read the next tile's boxes from the copy where the weight's map reads zeros.
        found.append(f"K {k} a multiple of a stage's {tactic.tile_k} columns")
    return found


def tile_contiguous(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight`` [N, K] copied as the [N * K / 64, 64] matrix whose every ``rows`` x 64 box is contiguous."""
    n, k = weight.shape
    blocks = weight.reshape(n // rows, rows, k // BOX_K, BOX_K).permute(0, 2, 1, 3)
    return blocks.contiguous().reshape(n * k // BOX_K, BOX_K)


def check_layout(layout: str):
    """A ValueError unless ``layout`` is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"weight layout {layout!r} is not one of {LAYOUTS}")


def pre_swizzled(tiled: torch.Tensor) -> torch.Tensor:
    """``tiled`` (a tile-contiguous copy, [rows, 64] of a 2-byte type) with each row's 16-byte chunks where the
    128-byte swizzle stores them: chunk c of row r at c ^ (r % 8). A box starts at a multiple of its tile's rows
    (every legal height a multiple of 8) and lands at a 1024-byte aligned shared-memory tile, so its rows' swizzle
    phases are their indices here modulo 8."""
    if tiled.element_size() != ELEMENT_BYTES:
        raise ValueError(f"a {tiled.dtype} copy: the swizzle is laid out for {ELEMENT_BYTES}-byte elements")
    rows = tiled.shape[0]
    chunks = tiled.reshape(rows, CHUNKS_PER_ROW, -1)
    phase = torch.arange(rows, device=tiled.device) % SWIZZLE_ROWS
    places = torch.arange(CHUNKS_PER_ROW, device=tiled.device)[None, :] ^ phase[:, None]
    stored = torch.empty_like(chunks)
    stored.scatter_(1, places[:, :, None].expand_as(chunks), chunks)
    return stored.reshape(rows, -1)


def layout_copy(weight: torch.Tensor, rows: int, layout: str) -> torch.Tensor:
    """The copy of ``weight`` that ``layout`` (one of LAYOUTS) reads, for tiles of ``rows`` rows."""
    check_layout(layout)
    tiled = tile_contiguous(weight, rows)
    return pre_swizzled(tiled) if layout == "bulk" else tiled


def box_row(tactic, weight_row, k_tile, box, boxes_per_row):
    """The copy's first row of box ``box`` of stage ``k_tile`` (a K tile of ``tactic.tile_k`` columns) of the weight
    tile at row ``weight_row``, of a weight of ``boxes_per_row`` boxes along K: tile weight_row / R starts at row
    weight_row * boxes_per_row, its boxes R rows apart. Python integers, or the kernel's."""
    return weight_row * boxes_per_row + (k_tile * tactic.k_boxes + box) * tactic.weight_load_rows


def bulk_box(tactic, row):
    """(first byte, bytes) of the box at copy row ``row`` (box_row), for the ``bulk`` layout's 1-D copy. Python
    integers, or the kernel's (a 32-bit offset: weights under 2 GiB)."""
    return row * ROW_BYTES, tactic.weight_load_rows * ROW_BYTES


def tiled_weight_gemm(base, k: int, layout: str = "tiles"):
    """A subclass of SplitKGemm class ``base`` that loads its weight boxes from the ``layout`` copy of a weight of
    ``k`` columns (layout_copy): through a map of that copy with the kernel's usual box, or for ``bulk`` each box
    with one 1-D bulk copy of its rows x 128 bytes from the copy's address, passed where the kernel takes its
    weight map's."""
    check_layout(layout)
    k_boxes_per_row = k // BOX_K
    bulk = layout == "bulk"

    class TiledWeightGemm(base):
        @cute.jit
        def load_weight(self, weight_tiles, state, descriptor, tiles, k_tile, fold_stride, weight_row, sharers_mask):
            t = self.tactic
            if nvvm.elect_sync():
                for box in cutlass.range_constexpr(t.k_boxes):
                    target = (weight_tiles + state.index * (t.weight_smem_rows * t.tile_k)
                              + box * (t.weight_smem_rows * BOX_K))
                    row = box_row(t, weight_row, k_tile, box, k_boxes_per_row)
                    barrier = tiles.producer_get_barrier(state)
                    if cutlass.const_expr(bulk):
                        first_byte, size = bulk_box(t, row)
                        nvvm.cp_async_bulk_shared_cluster_global(
                            target, descriptor + first_byte, barrier, size, l2_cache_hint=EVICT_FIRST,
                        )
                    else:
                        nvvm.cp_async_bulk_tensor_shared_cta_global(
                            target, descriptor, [0, row], barrier, l2_cache_hint=EVICT_FIRST,
                        )

    if not bulk:
        return TiledWeightGemm

    class BulkWeightGemm(TiledWeightGemm):
        @staticmethod
        def weight_descriptor(weight_map):
            """Here the pre-swizzled copy's address: no tensor map."""
            return cute.make_ptr(cutlass.Uint8, weight_map, cute.AddressSpace.gmem, assumed_align=16)

        def prefetch_weight_map(self, weight_map):
            """No tensor map to acquire or prefetch."""

    return BulkWeightGemm
