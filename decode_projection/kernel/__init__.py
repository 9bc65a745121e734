"""The kernels: the split-K GEMM (``splitk``), the tactics that configure it and the one check of which can run
(``tactic``), and the decode glue kernels with their host side (``norm``, ``activation``, ``rowwise``).

Layer 1 of docs/architecture.md: imports ``runtime`` only.
"""
