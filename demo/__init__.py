"""The demo: TPC-H sources as Delta tables with CDF, a few views, two refreshes, a check.

Run it with the README's first command (``./dev demo``), or ``python -m demo --help``.
"""
