"""How many thread-block clusters of each size the GPU holds at once, one CTA per SM.

A cluster's CTAs must share one GPC, and the GPCs of an H100/H200 do not all hold
the same number of SMs, so a grid of whole clusters may need a second wave well
before it has one CTA per SM. The tactic cost model and candidate lists count
waves from these numbers.

    python scripts/cluster_residency.py
"""

import cutlass.utils as utils
import torch

from decode_projection.splitk import PORTABLE_CLUSTER

info = utils.HardwareInfo()
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"{torch.cuda.get_device_name(0)}, {sms} SMs")
print("cluster  clusters  CTAs  idle SMs")
for size in range(1, PORTABLE_CLUSTER + 1):
    clusters = info.get_max_active_clusters(size)
    print(f"{size:>7}  {clusters:>8}  {clusters * size:>4}  {sms - clusters * size:>8}")
