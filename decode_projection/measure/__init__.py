"""Measuring prepared projections: timing (``timing``, with the PDL glue kernel of ``glue``), float64 checks
(``checks``, ``ops_reference``), GPU clocks (``clocks``), the streaming-read ceiling (``ceiling``), the
benchmark (``bench``) and its reports (``report``, ``compile_report``).

Layer 4 of docs/architecture.md: above the library (it measures what users get); the tuner builds on it.
"""
