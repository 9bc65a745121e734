"""Which tactic each padded batch gets: the heuristic and the cost model (``policies``), the tuned tables and
their JSON (``tables``, ``tables/*.json``) and the workload they are tuned for (``workload``).

Layer 2 of docs/architecture.md: imports ``runtime`` and ``kernel`` only.
"""
