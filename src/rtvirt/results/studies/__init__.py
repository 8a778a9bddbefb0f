"""The published studies rtvirt's built-in scenarios reproduce: their tables and the papers' reference values
(docs/studies.md). The study names and a run's provenance belong to the scenario (scenario/studies.py)."""
