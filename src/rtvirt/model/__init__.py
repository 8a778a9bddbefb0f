"""The simulation model (docs/model.md): schema and loader."""

from .loader import check_model, field_path, home_cpu, load_model, model_from_dict
from .overrides import apply_override, parse_assignment, parse_sweep
from .schema import GUEST_SCHEDULERS, HV_SCHEDULERS, SERVERS, Model

__all__ = ["Model", "load_model", "model_from_dict", "check_model", "field_path", "home_cpu", "HV_SCHEDULERS",
           "GUEST_SCHEDULERS", "SERVERS", "apply_override", "parse_assignment", "parse_sweep"]
