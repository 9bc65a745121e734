"""The weight map's set-up without its acquire, its prefetch or both, for the start-up probe: which delays a CTA's
first weight box after another kernel?

The projection's weight map lives in device memory (a host copy writes it at prepare time), and each CTA's producer
warp acquires it for the tensormap proxy and prefetches it before its first box (``SplitKGemm.prefetch_weight_map``).
Loaded without a map (tiled_weight.py's ``bulk`` layout) every CTA issues its first load at once, where through the
map the last ones wait 0.5-0.6 us longer, and 11-25 MB weights end up to 0.9 us sooner after glue
(docs/launch-contexts.md). These variants keep the map on the row-major weight and drop one step or both. A probe,
not the library's kernel: the acquire is what the memory model asks of a map written through the generic proxy; the
probe's float64 check only shows that a map written long before the launch was read right this time.
"""

import cutlass
import cutlass.cute as cute
from cutlass.experimental.primitives import nvvm_wrapper as nvvm

VARIANTS = ("no-acquire", "no-prefetch", "neither")


def map_variant_gemm(base, variant: str):
    """A subclass of SplitKGemm class ``base`` whose producer warp sets up the weight map as ``variant`` (one of
    VARIANTS) says: prefetching it only, acquiring it only, or neither."""
    if variant not in VARIANTS:
        raise ValueError(f"weight map variant {variant!r} is not one of {VARIANTS}")
    acquire, prefetch = variant == "no-prefetch", variant == "no-acquire"

    class MapVariantGemm(base):
        @cute.jit
        def prefetch_weight_map(self, weight_map):
            """The weight map's acquire and prefetch, each only where the variant keeps it."""
            descriptor = self.weight_descriptor(weight_map)
            if cutlass.const_expr(acquire):
                nvvm.fence_proxy_acquire("gpu", descriptor, 128)
            if cutlass.const_expr(prefetch):
                if nvvm.elect_sync():
                    nvvm.prefetch_tensormap(descriptor)

    return MapVariantGemm
