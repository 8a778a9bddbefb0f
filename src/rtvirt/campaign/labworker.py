"""One target's campaign of a lab scenario, in a process of its own (started by :func:`rtvirt.campaign.lab.
run_lab_scenario`)::

    python -m rtvirt.campaign.labworker RESULTS STATE.json OUTCOME.json LAB_PID

Each target's campaign runs in the main thread of its own process, where Ctrl-C and SIGTERM reach it as they
reach ``rtvirt run``: as KeyboardInterrupt at the next bytecode of the one thread that runs it. (A thread can
only be interrupted asynchronously, and such an exception can land in the logging module's at-fork handler
while the thread starts a subprocess, leaving logging's lock held: every other thread then hangs.)

The lab starts it in a session of its own and forwards each Ctrl-C once; should the lab die, the kernel sends
this process SIGTERM, which stops its run as Ctrl-C does. What the campaign gave goes to OUTCOME.json; with the lab
gone, nobody reads it, and the campaigns remove the lab's scratch directory instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ..errors import RtvirtError, stop_on_signals
from ..fileio import write_atomically
from ..procs import die_with_parent, process_state


def run_target_campaign(results: Path, state_path: Path) -> dict[str, Any]:
    """Run the campaign whose state is ``state_path``; what became of it, as the lab reports it."""
    from ..consoles import make_console
    from ..scenario import parse_scenario
    from . import CampaignState, run_campaign

    try:
        state = CampaignState.load(state_path)
        scenario = parse_scenario(state.scenario_text, state.source)
        result = run_campaign(scenario, state, results, console=make_console(stderr=True),
                              show_progress=False, write_report=False, reclaim=False)
    except KeyboardInterrupt:
        return {"interrupted": True}
    except RtvirtError as exc:
        return {"reason": str(exc)[:500]}
    return {"interrupted": result.interrupted,
            "runs": {key: o.status for key, o in result.outcomes.items()},
            "unmeasured": [key for key, o in result.outcomes.items() if not o.measured],
            "run_ids": [o.run_id for o in result.outcomes.values() if o.run_id]}


def main(argv: list[str]) -> int:
    results, state_path, outcome_path, lab_pid = argv
    stop_on_signals()
    die_with_parent(signal.SIGTERM)
    if _lab_waits(int(lab_pid)):
        outcome = run_target_campaign(Path(results), Path(state_path))
        if _lab_waits(int(lab_pid)):
            write_atomically(Path(outcome_path), json.dumps(outcome))
            return 0
    # the lab died (before die_with_parent above, or during the campaign): nobody waits for the outcome
    _leave_scratch(Path(outcome_path).parent)
    return 1


def _lab_waits(lab_pid: int) -> bool:
    """Whether the lab that started this campaign still waits for it. Being our parent is not enough: a lab
    killed with -9 hands us to its other threads while its main thread is already a zombie, and the kernel's
    SIGTERM comes then, with getppid() still naming the lab (seen in 1 of 6 killed labs)."""
    return os.getppid() == lab_pid and process_state(lab_pid) not in (None, "Z", "X")


def _leave_scratch(scratch: Path) -> None:
    """Remove the dead lab's scratch directory: it holds outcomes only, which nobody will read now."""
    for outcome in scratch.glob("*"):
        outcome.unlink(missing_ok=True)
    # the lab's other campaigns do the same: the first to end removes it, the others find it gone
    with contextlib.suppress(OSError):
        scratch.rmdir()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
