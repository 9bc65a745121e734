"""What the tactic choice needs to know about a GPU: SMs, shared memory, HBM bandwidth and how many
clusters of each size run at once (a cluster's CTAs share a GPC, so fewer fit than SMs / size)."""

import functools
import logging
from dataclasses import dataclass, replace

import torch

from .sm90 import PORTABLE_CLUSTER, SMEM_PER_SM

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSpec:
    """What the heuristic needs to know about a GPU."""

    name: str
    sm_count: int
    smem_per_sm: int
    hbm_bytes_per_us: float  # streaming-read ceiling, measured once per known card (KNOWN_GPUS)
    # Clusters of 1, 2, ... CTAs resident at once, one CTA per SM (scripts/cluster_residency.py):
    # a cluster's CTAs share a GPC, so fewer fit than SMs / size. Unmeasured: SMs / size.
    cluster_slots: tuple[int, ...] = ()

    def clusters_at_once(self, size: int) -> int:
        """How many clusters of ``size`` CTAs run at once with one CTA per SM."""
        return self.cluster_slots[size - 1] if size <= len(self.cluster_slots) else self.sm_count // size


# Measured once per card and shipped, so that a known card's picks never depend on a run-time measurement:
# the read ceiling of ceiling.py on the largest Kimi-K3 weight (20480 x 7168, back to back; H100 2026-12-06:
# 95.4 us for 293.6 MB, docs/measurements/2026-12-06-bench-h100-contexts.json) and cluster residency
# (scripts/cluster_residency.py; on both cards only 30 clusters of 4 fit at once, 120 CTAs, 39 of 3, 15 of 8:
# docs/measurements/2026-12-02-cluster-residency-h200.txt, 2026-12-06-startup-probe-h100.txt).
H200 = GpuSpec("NVIDIA H200", 132, SMEM_PER_SM, 4.4e6, (132, 66, 39, 30, 22, 17, 15, 15))
H100 = GpuSpec("NVIDIA H100 80GB HBM3", 132, SMEM_PER_SM, 3.08e6, (132, 66, 39, 30, 22, 17, 15, 15))
KNOWN_GPUS = {spec.name: spec for spec in (H200, H100)}
# An unknown card's ceiling: the lowest of any Hopper part (H100 PCIe, 2.0 TB/s on its datasheet).
UNKNOWN_BYTES_PER_US = 2.0e6


def gpu_spec(device=None, *, measure_clusters=False) -> GpuSpec:
    """The spec of ``device``'s GPU (the H200's when none is given): a known card's shipped constants, else its SM
    count and shared memory from the device with a conservative ceiling and SMs / size clusters (logged once);
    ``measure_clusters`` asks the driver for cluster residency instead (compiles a probe kernel: for the tuner)."""
    if device is None:
        return H200
    props = torch.cuda.get_device_properties(device)
    known = KNOWN_GPUS.get(props.name)
    if known is not None and known.sm_count == props.multi_processor_count:
        spec = known
    else:
        smem = getattr(props, "shared_memory_per_multiprocessor", SMEM_PER_SM)
        spec = GpuSpec(props.name, props.multi_processor_count, smem, UNKNOWN_BYTES_PER_US)
        _log_unknown(spec.name, spec.sm_count)
    if measure_clusters:
        spec = replace(spec, cluster_slots=measured_cluster_slots(device_index(device)))
    return spec


@functools.cache
def _log_unknown(name: str, sm_count: int) -> None:
    """Say once per card that its constants are assumed, not measured."""
    logger.info("no shipped constants for %s (%d SMs): read ceiling assumed %.1f TB/s, clusters SMs / size",
                name, sm_count, UNKNOWN_BYTES_PER_US / 1e6)


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
