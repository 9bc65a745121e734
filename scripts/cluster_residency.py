"""How many thread-block clusters of each size the GPU holds at once, one CTA per SM.

A cluster's CTAs must share one GPC, and the GPCs of an H100/H200 do not all hold
the same number of SMs, so a grid of whole clusters may need a second wave well
before it has one CTA per SM. The cost model counts waves from these numbers
(``GpuSpec.cluster_slots``; the tuner measures them itself).

    python scripts/cluster_residency.py
"""

import torch

from decode_projection.runtime.gpu import measured_cluster_slots

sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"{torch.cuda.get_device_name(0)}, {sms} SMs")
print("cluster  clusters  CTAs  idle SMs")
for size, clusters in enumerate(measured_cluster_slots(0), start=1):
    print(f"{size:>7}  {clusters:>8}  {clusters * size:>4}  {sms - clusters * size:>8}")
