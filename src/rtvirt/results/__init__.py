"""Analysis of stored runs: time windows, isolation against a baseline, ramps and transitions, verdicts,
the DuckDB catalog and the report."""
