"""Data quality of the lake's Delta tables with Great Expectations (issue 5).

:mod:`pipelines.quality.suites` says what every table must satisfy (one expectation suite per
table, each expectation flagged critical or not); :mod:`pipelines.quality.runner` runs the suites
on Spark DataFrames read from the lake and keeps the results (JSON and Data Docs) under
``<lake>/_quality``. ``jobs/validate.py`` is the command-line entry.
"""
