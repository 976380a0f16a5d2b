"""The engine over the lake: refreshing views from their inputs' changes, verifying them, and
tending the lake; the ``ivm`` command. Built on the SQL front end and planner (:mod:`ivm`), the
operators (:mod:`ops`) and the lake and Spark (:mod:`resources`). Never imports Dagster.

:class:`engine.facade.Engine` is the entry point; :class:`engine.inspect.Inspector` reads a
project's lake without Spark (nothing here imports PySpark until a module that needs it is
imported).
"""
