"""What sm_90 (Hopper) hardware fixes, for the tactic rules (``tactic.py``) and the GPU spec (``gpu.py``).

A leaf module: the numbers of the architecture, not choices of this kernel.
"""

WGMMA_ROWS = 64  # rows of wgmma's A per warpgroup: its M
TMA_ALIGN = 16  # bytes: a TMA tensor's base address and row pitch granularity
MOST_WGMMA_COLUMNS = 256  # wgmma's N is a multiple of 8 up to this (also the most rows of a TMA box)
PORTABLE_CLUSTER = 8  # CTAs a cluster may hold without the non-portable attribute
SMEM_CAPACITY = 227 * 1024  # opt-in shared memory per block
SMEM_PER_SM = 228 * 1024  # shared memory per SM, shared by its resident CTAs
RESERVED_SMEM_PER_CTA = 1024  # what the driver keeps per resident CTA
QUARTER_REGISTERS = 16384  # registers of each quarter of an SM, which runs one warp of every warpgroup
