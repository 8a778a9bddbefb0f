"""Predicted next to measured: what each measured environment *is* in model terms (docs/predictions.md).

A scenario's ``[predict]`` table makes ``rtvirt run`` derive a simulation model for every configuration it
measures (environment x disturbance x workload), simulate and analyse it, and store both beside the
measured runs (one store, sources ``simulated`` and ``analysis``). The table's schema belongs to the
scenario's (rtvirt.scenario.predict, re-exported here); the derivation (:mod:`.derive`), the campaign step
(:mod:`.campaign`) and the comparison (:mod:`.compare`) import the simulator and the analysis when used.
"""

from __future__ import annotations

from ..scenario.predict import PredictSpec

__all__ = ["PredictSpec"]
