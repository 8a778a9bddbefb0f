"""Ctrl-C for a lab's campaign threads: raised again until handled, never during the handler's clean-up."""

from __future__ import annotations

import threading
import time

from rtvirt.interrupts import REDELIVER_S, acknowledge, interrupt_threads, interruptible


def _worker(handled: threading.Event, log: list[str], swallow_first: bool, cleanup_s: float) -> None:
    with interruptible(handled):
        swallowed = not swallow_first
        while True:
            try:
                while True:
                    time.sleep(0.01)
            except KeyboardInterrupt:
                if not swallowed:  # as Python does when it lands in an at-fork handler ("Exception ignored")
                    swallowed = True
                    log.append("lost")
                    continue
                acknowledge()
                log.append("handled")
                time.sleep(cleanup_s)  # agents stopped, samples stored: longer than the re-delivery interval
                log.append("cleaned up")
                return


def test_an_interrupt_a_thread_lost_is_raised_again_until_handled() -> None:
    # a lab's Ctrl-C once landed in logging's at-fork handler of a campaign thread: that thread ran on
    logs: list[list[str]] = [[], []]
    workers = []
    for log, swallow in zip(logs, (True, False), strict=True):
        handled = threading.Event()
        thread = threading.Thread(target=_worker, args=(handled, log, swallow, REDELIVER_S * 1.5), daemon=True)
        thread.start()
        workers.append((thread, handled))
    time.sleep(0.1)
    started = time.monotonic()
    interrupt_threads(workers)
    assert not any(thread.is_alive() for thread, _ in workers)
    # the lost one was raised again; neither clean-up was interrupted once its thread had said it handled it
    assert logs == [["lost", "handled", "cleaned up"], ["handled", "cleaned up"]]
    assert time.monotonic() - started < REDELIVER_S * 4
