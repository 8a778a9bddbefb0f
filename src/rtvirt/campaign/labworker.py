"""One target's campaign of a lab scenario, in a process of its own (started by :func:`rtvirt.campaign.lab.
run_lab_scenario`)::

    python -m rtvirt.campaign.labworker RESULTS STATE.json OUTCOME.json LAB_PID

Each target's campaign runs in the main thread of its own process, where Ctrl-C and SIGTERM reach it as they
reach ``rtvirt run``: as KeyboardInterrupt at the next bytecode of the one thread that runs it. (A thread can
only be interrupted asynchronously, and such an exception can land in the logging module's at-fork handler
while the thread starts a subprocess, leaving logging's lock held: every other thread then hangs.)

The lab starts it in a session of its own and forwards each Ctrl-C once; should the lab die, the kernel sends
this process SIGTERM, which stops its run as Ctrl-C does. What the campaign gave goes to OUTCOME.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ..errors import RtvirtError, stop_as_interrupt
from ..fileio import write_atomically
from ..procs import die_with_parent


def run_target_campaign(results: Path, state_path: Path) -> dict[str, Any]:
    """Run the campaign whose state is ``state_path``; what became of it, as the lab reports it."""
    from rich.console import Console

    from ..scenario import parse_scenario
    from . import CampaignState, run_campaign

    try:
        state = CampaignState.load(state_path)
        scenario = parse_scenario(state.scenario_text, state.source)
        result = run_campaign(scenario, state, results, console=Console(stderr=True, highlight=False),
                              show_progress=False, write_report=False, reclaim=False)
    except KeyboardInterrupt:
        return {"interrupted": True}
    except RtvirtError as exc:
        return {"reason": str(exc)[:500]}
    return {"interrupted": result.interrupted,
            "runs": {key: o.status for key, o in result.outcomes.items()},
            "run_ids": [o.run_id for o in result.outcomes.values() if o.run_id]}


def main(argv: list[str]) -> int:
    results, state_path, outcome_path, lab_pid = argv
    signal.signal(signal.SIGTERM, stop_as_interrupt)
    die_with_parent(signal.SIGTERM)
    if os.getppid() != int(lab_pid):  # the lab died before the line above: nobody waits for this campaign
        return 1
    outcome = run_target_campaign(Path(results), Path(state_path))
    write_atomically(Path(outcome_path), json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
