"""The hierarchical scheduling simulator (docs/simulator.md): model in, job/event/gap records out."""

from .core import SimResult, core_config, simulate
from .gantt import gantt_svg, write_gantt
from .results import simulate_to_store, task_summary, write_simulated_run

__all__ = ["SimResult", "simulate", "core_config", "simulate_to_store", "task_summary", "write_simulated_run",
           "gantt_svg", "write_gantt"]
