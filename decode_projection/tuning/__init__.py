"""Making tuned tables: the candidates worth timing (``candidates``), the tuner (``tune``) and the table
commands (``table_tools``: replace, merge, diff).

Layer 5 of docs/architecture.md: times candidates with ``measure``; only the command line sits above it.
"""
