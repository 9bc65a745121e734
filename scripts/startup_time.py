"""First prepare() of the Kimi-K3 layer set, cold versus warm persistent compile cache.

Each start runs in a fresh process with the same throwaway cache directory: the
first finds it empty (compiles everything), the second finds every kernel on
disk. With a Hopper GPU the layer set is prepared end to end
(``PreparedProjection.for_weight`` per shape); without one, the kernels are
compiled for sm_90a only.

    python scripts/startup_time.py
"""

import os
import subprocess
import sys
import tempfile
import time

CHILD = """
import time, torch
started = time.perf_counter()
from decode_projection.runtime.gpu import H200
from decode_projection.policy.policies import resolve_policies
from decode_projection.policy.workload import DECODE_BATCHES, KIMI_K3_SHAPES
from decode_projection.projection import PreparedProjection, compile_projection
imported = time.perf_counter()
if torch.cuda.is_available():
    for n, k in KIMI_K3_SHAPES:
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        PreparedProjection.for_weight(weight, batches=DECODE_BATCHES)
    torch.cuda.synchronize()
else:
    for n, k in KIMI_K3_SHAPES:
        policies, _ = resolve_policies(n, k, DECODE_BATCHES, gpu=H200, weight_dtype=torch.bfloat16,
                                       output_dtype=torch.bfloat16)
        for tactic in set(policies.values()):
            compile_projection(tactic, torch.bfloat16, "sm_90a")
print(f"{imported - started:.2f} {time.perf_counter() - imported:.2f}")
"""


def main():
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "DECODE_PROJECTION_CACHE_DIR": cache}
        for start in ("cold", "warm"):
            began = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
            imports, prepare = out.stdout.split()
            kernels = len([f for f in os.listdir(cache) if f.endswith(".o")])
            print(f"{start}: prepare {prepare} s (imports {imports} s, process {time.perf_counter() - began:.1f} s), "
                  f"{kernels} kernels in the cache")


if __name__ == "__main__":
    main()
