"""Starting children: a stop signal that comes meanwhile takes effect after the child is recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtvirt.procs import Supervisor, process_state, stops_deferred


def test_ctrl_c_during_the_block_is_raised_after_it() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), stops_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # Python would have run the handler long before this
        done.append("block ended")
    assert done == ["block ended"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_during_the_block_reaches_its_own_handler_once_after_it() -> None:
    seen: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _: seen.append("handler"))
    try:
        with stops_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            seen.append("block ended")
        assert seen == ["block ended", "handler"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_child_started_under_a_stop_is_recorded_before_the_interrupt() -> None:
    supervisor = Supervisor()

    def stop_meanwhile() -> None:  # runs in the child: the parent is inside start() when the signal comes
        os.kill(os.getppid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        supervisor.start(["sleep", "30"], before_exec=stop_meanwhile)
        time.sleep(1)
    children = supervisor.children
    try:
        assert len(children) == 1 and children[0].poll() is None
    finally:
        supervisor.stop_all()
    assert children[0].poll() is not None


# A Ctrl-C that lands while the garbage collector runs a weakref callback (what lost one in a docs example's
# `rtvirt run`: "Exception ignored in: WeakKeyDictionary...remove ... KeyboardInterrupt", then the campaign ran
# to its end and exited 0). The callback here waits, so that the test's SIGINT lands inside it.
_CALLBACK_THEN_WORK = """
import sys, time, weakref
from rtvirt.errors import stop_on_signals
if sys.argv[1] == "installed":
    stop_on_signals()
class Thing: pass
thing = Thing()
def collected(_):
    print("in-callback", flush=True)
    time.sleep(5)
keep = weakref.ref(thing, collected)
try:
    del thing
    for _ in range(50):
        time.sleep(0.1)
    print("went on")
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.parametrize("hook", ["installed", "python's own"])
def test_a_ctrl_c_that_python_ignores_inside_a_gc_callback_is_delivered_again(hook: str) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _CALLBACK_THEN_WORK, hook], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "in-callback"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    # Python's own hook prints the lost interrupt and goes on; ours stops the work right after the callback
    assert out.strip() == ("interrupted" if hook == "installed" else "went on"), (out, err)
    assert ("Exception ignored" in err) == (hook != "installed"), err


_ORPHANED_BEFORE_IT_ASKED = """
import os, sys, time
from rtvirt.procs import die_with_parent
parent = os.getpid()
child = os.fork()
if child == 0:
    while os.getppid() == parent:  # the window a kill -9 can hit: the parent gone between fork and prctl
        time.sleep(0.01)
    die_with_parent(parent=parent)
    open(sys.argv[1], "w").write("outlived its parent")
    os._exit(0)
print(child, flush=True)
os._exit(0)
"""


def test_a_child_whose_parent_died_before_it_asked_to_die_with_it_ends_at_once(tmp_path: Path) -> None:
    """The kernel's parent-death signal comes only for a parent that dies after it was asked for: a stressor
    started as its rtvirt was SIGKILLed kept a CPU busy for the rest of a suite. die_with_parent then ends the
    child itself."""
    marker = tmp_path / "outlived"
    started = subprocess.run([sys.executable, "-c", _ORPHANED_BEFORE_IT_ASKED, str(marker)], capture_output=True,
                             text=True, timeout=60, check=True)
    child = int(started.stdout)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and process_state(child) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_state(child) in (None, "Z") and not marker.exists()


MOVE_AND_RESTORE = """
import json, os, threading
from rtvirt.procs import move_threads, restore_threads
everywhere = os.sched_getaffinity(0)
stop = threading.Event()
earlier, own = threading.Thread(target=stop.wait), threading.Thread(target=stop.wait)
earlier.start(); own.start()
os.sched_setaffinity(own.native_id, {max(everywhere)})  # a thread placed on purpose (a tracer's reader)
moved = move_threads({min(everywhere)})
later = threading.Thread(target=stop.wait); later.start()
threads = (threading.main_thread(), earlier, own, later)
during = [sorted(os.sched_getaffinity(thread.native_id)) for thread in threads]
restore_threads(moved)
after = [sorted(os.sched_getaffinity(thread.native_id)) for thread in threads]
stop.set()
print(json.dumps({"everywhere": sorted(everywhere), "during": during, "after": after}))
"""


def test_threads_moved_off_cpus_are_all_moved_and_each_gets_its_own_cpus_back() -> None:
    """What an SSH target that is this machine asks of rtvirt's threads while a probe runs there: every thread,
    also one started meanwhile, on the CPUs given; afterwards each on the CPUs it had (one started meanwhile on
    the main thread's)."""
    assert len(os.sched_getaffinity(0)) >= 2, "this test needs two CPUs to move threads between"
    done = subprocess.run([sys.executable, "-c", MOVE_AND_RESTORE], capture_output=True, text=True, timeout=60,
                          check=True)
    found = json.loads(done.stdout)
    everywhere = found["everywhere"]
    assert found["during"] == [[min(everywhere)]] * 4
    assert found["after"] == [everywhere, everywhere, [max(everywhere)], everywhere]
