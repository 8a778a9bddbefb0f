"""The campaign step: simulate and analyse every measured configuration, store both beside the measurement.

Per configuration (environment x disturbance x workload; repetitions share it) the model is derived
(:mod:`.derive`) or read from the scenario's explicit model file, analysed (``rtvirt.analysis``) and
simulated (``rtvirt.sim``); the analysis run and the simulated run land in the same results store as the
measured runs. The simulated run's manifest carries ``predict`` = {config, compare, metric, bound_ns,
analysis_run, mapping, notes}: everything the report needs to put the three answers side by side.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import InputError, RtvirtError
from ..model import Model
from ..scenario.schema import Scenario
from . import PredictSpec
from .derive import Derived, NotPredictable, derive_model
from .tick import EnforcementTick, enforcement_tick, tick_phase

__all__ = ["predict_configuration", "predict_campaign", "check_predict", "SIMULATED_SUFFIX", "bound_of"]

SIMULATED_SUFFIX = " (simulated)"
EXTRA_SEEDS = (2, 3, 4, 5)  # a model that draws is simulated again with these seeds (the spread is reported)
_STATE_PREFIX = "predict/"


def _explicit(spec: PredictSpec, base_dir: Path, duration_ns: int) -> Derived:
    from ..model import load_model

    path = Path(spec.model or "")
    if not path.is_absolute():
        path = base_dir / path
    model = load_model(path, overrides=[("simulation.duration", f"{duration_ns}ns")])
    compare = spec.compare or ""
    kinds = {f"{vm.name}/{t.name}" for vm in model.vm for t in vm.task} | \
        {f"gap:{vm.name}.{vm.gap.vcpu}" for vm in model.vm if vm.gap is not None}
    if compare not in kinds:
        raise InputError(f"field 'predict.compare': {compare!r} is not a task or gap probe of {path} "
                         f"(have: {', '.join(sorted(kinds)) or 'none'})")
    return Derived(model, compare, "gap" if compare.startswith("gap:") else "latency",
                   [f"explicit model {path.name}"], [])


def bound_of(model: Model, analysis: Any, compare: str) -> tuple[int | None, str]:
    """The analysed bound of what is compared: a gap's longest supply blackout, or a job's start bound
    (its response bound minus its execution: a job cannot start later than its finish minus its work)."""
    from ..analysis.servers import VcpuRef

    if compare.startswith("gap:"):
        vm, _, vcpu = compare.removeprefix("gap:").rpartition(".")
        supply = analysis.supplies.get(VcpuRef(vm, int(vcpu)))
        if supply is None or supply.supply is None:
            return None, (supply.reason if supply is not None else "no supply") or "no supply bound"
        # the longest interval in which the vCPU may get no CPU at all: sbf(t) = 0 up to time_for(1) - 1
        return supply.supply.time_for(1) - 1, f"longest interval without supply ({supply.supply.describe()})"
    vm, _, task = compare.partition("/")
    result = next((t for t in analysis.tasks if t.vm == vm and t.task == task), None)
    if result is None or result.wcrt is None:
        return None, result.reason if result is not None else "task not analysed"
    spec = next(t for v in model.vm if v.name == vm for t in v.task if t.name == task)
    execution = spec.execution if isinstance(spec.execution, int) else spec.execution.min
    return result.wcrt - execution, f"response bound {result.wcrt} ns minus the job's execution"


def predict_configuration(derived: Derived, results: Path, config: str, *, scenario: str | None = None,
                          long_gap_ns: int | None = None) -> tuple[str, str]:
    """Analyse and simulate one configuration's model; returns (simulated run id, analysis run id)."""
    from ..analysis.record import write_analysis_run
    from ..analysis.system import analyse_model
    from ..sim import simulate, write_simulated_run

    analysis = analyse_model(derived.model)
    bound, why = bound_of(derived.model, analysis, derived.compare)
    info: dict[str, Any] = {"config": config, "compare": derived.compare, "metric": derived.metric,
                            "bound_ns": bound, "bound_method": why, "mapping": derived.mapping,
                            "notes": derived.notes, "scenario": scenario, "long_gap_ns": long_gap_ns}
    analysis_run, _ = write_analysis_run(analysis, results, model_path=f"derived:{config}",
                                         extra={"predict": info})
    result = simulate(derived.model)
    if derived.metric == "gap" and _draws(derived.model):
        info["seed_rates"] = _seed_rates(derived.model, derived.compare, result, long_gap_ns)
    run, _ = write_simulated_run(result, results, model_path=f"derived:{config}", params={},
                                 label=config + SIMULATED_SUFFIX,
                                 extra={"predict": {**info, "analysis_run": analysis_run.run_id},
                                        "scenario": scenario})
    return run.run_id, analysis_run.run_id


def _draws(model: Model) -> bool:
    """Whether the model's outcome depends on its seed: it draws each resumption's latency from several."""
    return len(set(model.hypervisor.enforcement.resume_latencies)) > 1


def _seed_rates(model: Model, compare: str, first: Any, long_gap_ns: int | None) -> dict[str, Any]:
    """The rate of long gaps the model gives with its own seed and EXTRA_SEEDS more, counted as predict.compare
    counts them: where its ticks fall among the resumptions, which pattern of holes a run of a few seconds mostly
    sees is chance (in the kernel too), and the spread over seeds says how far one run may be from another."""
    import numpy as np

    from ..sim import simulate
    from ..stats import HistogramBuilder
    from .compare import distribution, long_gap_threshold

    vcpu = compare.removeprefix("gap:")
    seconds = model.simulation.duration / 1e9

    def gaps(result: Any) -> Any:
        names = result.gaps["vcpu"].to_pylist()
        builder = HistogramBuilder()
        builder.add(np.array([g for g, name in zip(result.gaps["gap_ns"].to_pylist(), names, strict=True)
                              if name == vcpu], dtype=np.int64))
        return builder.finish() if builder.has_samples else None

    results = [first] + [simulate(model.model_copy(update={"simulation": model.simulation.model_copy(
        update={"seed": seed})})) for seed in EXTRA_SEEDS]
    histograms = [gaps(result) for result in results]
    threshold = long_gap_threshold(histograms[0], long_gap_ns)
    rates = [distribution(histogram, seconds, threshold).long_gap_rate or 0.0 for histogram in histograms]
    return {"seeds": [model.simulation.seed, *EXTRA_SEEDS], "long_gap_ns": threshold, "rates_per_s": rates}


def _scenario_dir(state: Any) -> Path:
    """Explicit model paths are relative to the scenario file (built-in scenarios: the working directory)."""
    source = Path(state.source)
    return source.parent if source.is_file() else Path.cwd()


def check_predict(scenario: Scenario, state: Any) -> None:
    """Refuse a bad explicit model (unreadable, invalid, unknown ``compare``) before anything is measured."""
    spec = scenario.predict
    if spec is not None and spec.enabled and spec.model is not None:
        _explicit(spec, _scenario_dir(state), 1_000_000_000)


def _measured_tick(spec: PredictSpec, environment: Any, plans: list[Any], config: str, results: Path,
                   state: Any) -> EnforcementTick | None:
    """The enforcement tick of the kernel that measured ``config`` (its first stored run's audit), with the
    tick's phase in the reservation's period read from that run's holes when it ran a gap probe in a
    SCHED_DEADLINE reservation; None with ``enforcement = "off"`` or where the audit does not say."""
    from ..store import load_run

    if spec.enforcement == "off":
        return None
    for plan in plans:
        entry = state.runs.get(plan.key, {})
        if plan.config != config or entry.get("status") != "complete" or not entry.get("run_id"):
            continue
        try:
            run = load_run(results / "runs" / entry["run_id"])
        except (OSError, ValueError, RtvirtError):
            continue
        tick = enforcement_tick(run.manifest.get("system"))
        period = _deadline_reservation(environment)
        if tick is None or period is None or run.manifest.get("probe") != "gap":
            return tick
        field = run.manifest.get("value_field") or "duration_ns"
        samples = run.samples(["t_ns", field]).to_pydict()
        runtime, length = period
        measured = tick_phase(samples["t_ns"], samples[field], tick.tick_ns, length,
                              min_hole_ns=max(1, (length - runtime) // 2), runtime_ns=runtime)
        return tick if measured is None else replace(tick, measured=measured, phase_from=f"measured in {run.run_id}")
    return None


def _deadline_reservation(environment: Any) -> tuple[int, int] | None:
    """(runtime, period) of the SCHED_DEADLINE reservation the measured workload runs in, if it does."""
    sched = getattr(environment, "sched", None) or getattr(environment, "vcpu_sched", None)
    if sched is None or getattr(sched, "policy", None) != "deadline":
        return None
    return int(sched.runtime), int(sched.period)


def predict_campaign(scenario: Scenario, plans: list[Any], results: Path, state: Any) -> list[str]:
    """Predict every configuration of ``plans`` not yet predicted in ``state``; returns messages to show.

    A configuration without a model (another probe, a platform without a mapping) is recorded with the
    reason; a prediction never fails the campaign's measurements."""
    spec = scenario.predict
    if spec is None or not spec.enabled:
        return []
    base_dir = _scenario_dir(state)
    messages = []
    seen: set[str] = set()
    for plan in plans:
        key = _STATE_PREFIX + plan.config
        if plan.config in seen or state.runs.get(key, {}).get("status") in ("predicted", "not predicted"):
            continue
        seen.add(plan.config)
        duration = int(spec.duration) if spec.duration is not None else plan.duration_ns
        try:
            if spec.model is not None:
                derived = _explicit(spec, base_dir, duration)
            else:
                environment = scenario.environments[plan.environment]
                derived = derive_model(environment, scenario.probe_workloads()[plan.workload],
                                       scenario.disturbances[plan.disturbance].stressors, duration, spec,
                                       name="derived-" + "".join(c if c.isalnum() else "-" for c in plan.config),
                                       tick=_measured_tick(spec, environment, plans, plan.config, results, state))
            simulated, analysed = predict_configuration(derived, results, plan.config, scenario=scenario.name,
                                                        long_gap_ns=spec.long_gap)
        except NotPredictable as exc:
            state.record(key, status="not predicted", reason=str(exc), config=plan.config)
            messages.append(f"not predicted {plan.config}: {exc}")
            continue
        except RtvirtError as exc:
            state.record(key, status="not predicted", reason=str(exc)[:500], config=plan.config)
            messages.append(f"prediction failed {plan.config}: {str(exc)[:500]}")
            continue
        state.record(key, status="predicted", run_id=simulated, analysis_run=analysed, config=plan.config)
        messages.append(f"predicted {plan.config}: simulated {simulated}, analysed {analysed}")
    return messages
