"""What can be checked without a GPU: the kernels a workload needs, compiled for sm_90a.

Each distinct tactic the policies pick is compiled for ``sm_90a`` and its cubin
disassembled: registers, shared memory, cluster size, and the counts of wgmma
(HGMMA), TMA loads (UTMALDG) and local-memory spills (LDL/STL).
"""

import time
from dataclasses import astuple

from ..projection import compile_projection
from ..runtime.sass import kernel_report
from ..warmup import kernel_jobs


def compile_report(shapes, batches, kinds, *, weight_dtype, output_dtype, arch="sm_90a") -> str:
    """Compile every tactic the policies need and describe each one."""
    tactics = {job[0] for job in kernel_jobs(shapes, batches, kinds, None, arch, weight_dtype, output_dtype)}
    lines = [f"{'tactic (rows,acts,split,stages,boxes,multicast,columns[,B][,E][,F: fold])':>72} {'regs':>4} {'smem KB':>7} {'cluster':>7} "
             f"{'HGMMA':>5} {'UTMALDG':>7} {'spills':>6} {'compile s':>9}"]
    for tactic in sorted(tactics, key=astuple):
        started = time.perf_counter()
        report = kernel_report(compile_projection(tactic, output_dtype, arch, weight_dtype))
        seconds = time.perf_counter() - started
        lines.append(f"{tactic.label:>72} {report.registers:>4} {tactic.smem_bytes / 1024:7.1f} {tactic.split * tactic.multicast:>7} "
                     f"{report.hgmma:>5} {report.utmaldg:>7} {report.spills:>6} {seconds:9.1f}")
    return "\n".join(lines)
