"""The weight map's set-up without its acquire, its prefetch or both, or the map passed by value, for the start-up
probe: which delays a CTA's first weight box after another kernel?

The projection's weight map lives in device memory (a host copy writes it at prepare time), and each CTA's producer
warp acquires it for the tensormap proxy and prefetches it before its first box (``SplitKGemm.prefetch_weight_map``).
Loaded without a map (tiled_weight.py's ``bulk`` layout) every CTA issues its first load at once, where through the
map the last ones wait 0.5-0.6 us longer, and 11-25 MB weights end up to 0.9 us sooner after glue
(docs/launch-contexts.md). These variants keep a map on the row-major weight: three drop one set-up step or both
(a probe, not the library's kernel: the acquire is what the memory model asks of a map written through the generic
proxy; the probe's float64 check only shows that a map written long before the launch was read right this time),
and ``by-value`` builds the map at launch and passes it as a launch parameter, as the activations' map is, with
the kernel's box and swizzle (and the TMA atom's default L2 promotion), prefetched and never acquired.
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import utils
from cutlass._mlir.dialects import cute as cute_ir
from cutlass._mlir.dialects import cute_nvgpu as cute_nvgpu_ir
from cutlass.cute.nvgpu import cpasync
from cutlass.experimental.primitives import nvvm_wrapper as nvvm

from decode_projection.kernel.tactic import BOX_K

VARIANTS = ("no-acquire", "no-prefetch", "neither", "by-value")


def map_variant_gemm(base, variant: str):
    """A subclass of SplitKGemm class ``base`` whose producer warp sets up the weight map as ``variant`` (one of
    VARIANTS) says: prefetching it only, acquiring it only, neither, or taking it by value (by_value_map_gemm)."""
    if variant not in VARIANTS:
        raise ValueError(f"weight map variant {variant!r} is not one of {VARIANTS}")
    if variant == "by-value":
        return by_value_map_gemm(base)
    acquire, prefetch = variant == "no-prefetch", variant == "no-acquire"

    class MapVariantGemm(base):
        @cute.jit
        def prefetch_weight_map(self, weight_map):
            """The weight map's acquire and prefetch, each only where the variant keeps it."""
            descriptor = self.weight_descriptor(weight_map)
            if cutlass.const_expr(acquire):
                nvvm.fence_proxy_acquire("sys", descriptor, 128)
            if cutlass.const_expr(prefetch):
                if nvvm.elect_sync():
                    nvvm.prefetch_tensormap(descriptor)

    return MapVariantGemm


def by_value_map_gemm(base):
    """A subclass of SplitKGemm class ``base`` that builds the weight's map at launch and takes it as a launch
    parameter (the device-resident map's address, still passed, goes unused)."""

    class ByValueMapGemm(base):
        def kernel_weight_map(self, weight, weight_map):
            """A TMA atom of ``weight`` loading the kernel's weight box (its rows x 64 columns, 128-byte swizzle)."""
            rows, operand = self.tactic.weight_load_rows, weight.element_type
            swizzled = sm90_utils.make_smem_layout_atom(
                sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, operand, BOX_K), operand
            )
            box = cute.tile_to_shape(swizzled, (rows, BOX_K), order=(0, 1))
            atom, _ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), weight, box, (rows, BOX_K))
            return atom

        @staticmethod
        def weight_descriptor(weight_map):
            """The generic address of the map among the kernel's parameters."""
            pointer = cute_ir.PtrType.get(cute_nvgpu_ir.TmaDescriptorTiledType.get(), cute.AddressSpace.generic, 64)
            return cute_nvgpu_ir.get_tma_desc_addr(pointer, cute_nvgpu_ir.atom_make_exec_tma(weight_map._trait.value))

        @cute.jit
        def prefetch_weight_map(self, weight_map):
            """Its prefetch only: a launch parameter is never written through the generic proxy."""
            if nvvm.elect_sync():
                cpasync.prefetch_descriptor(weight_map)

    return ByValueMapGemm
