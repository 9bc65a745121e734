"""What the tactic choice needs to know about a GPU: SMs, shared memory, HBM bandwidth and how many
clusters of each size run at once (a cluster's CTAs share a GPC, so fewer fit than SMs / size)."""

import functools
import logging
from dataclasses import dataclass

import torch

from .sm90 import PORTABLE_CLUSTER, SMEM_PER_SM

logger = logging.getLogger(__name__)


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
H200 = GpuSpec("NVIDIA H200", 132, SMEM_PER_SM, 4.4e6, (132, 66, 39, 30, 22, 17, 15, 15))


def gpu_spec(device=None, *, measure_clusters=False) -> GpuSpec:
    """The spec of ``device``'s GPU (the H200's when none is given); cluster residency is the H200's on one,
    else SMs / size, unless ``measure_clusters`` asks the driver (compiles a probe kernel: for the tuner)."""
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
            logger.warning("cluster residency not measured (%s): assuming SMs / cluster size", error)
            return ()
