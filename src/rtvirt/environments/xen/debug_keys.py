"""Xen's debug keys, read back: what a hung Xen lab says of itself when its keys are pressed on its serial console.

Three CTRL-a switch the serial console's input from dom0 to Xen; then single keys dump state ('d': every pCPU's
registers and call trace, '0': dom0's vCPUs with their guest stacks, 'q': the domains, 'r': the scheduler's run
queues). Xen handles its serial input in an interrupt, so a Xen that stopped taking interrupts prints nothing: that
itself says where the hang is. The dump stays in the lab's console log; ``summary`` makes one line of it for the
error that names the hang: where each pCPU was (Xen's own symbols) and where each dom0 vCPU was (an address in
dom0's kernel: Debian ships that kernel's symbols only in its -dbg package; an x86 PV dom0 runs where it was
linked, so a booted lab's /proc/kallsyms names it).
"""

from __future__ import annotations

import re

__all__ = ["DEBUG_KEYS", "summary"]

SWITCH_INPUT = b"\x01\x01\x01"
# pressed in this order, the input given back to dom0 at the end (a lab that was only slow goes on)
DEBUG_KEYS = [SWITCH_INPUT, b"d", b"0", b"q", b"r", SWITCH_INPUT]
ANSWERED = "' pressed -> "  # Xen's echo of a debug key it handles
STATE = re.compile(r"\*\*\* Dumping (CPU(\d+) host|CPU(\d+) guest|Dom0 vcpu#(\d+)) state(?: \((d\d+v\d+)\))?: \*\*\*")
WHERE = re.compile(r"\b(?:RIP|PC):\s+(?:[0-9a-f]{4}:)?\[?<?([0-9a-f]{8,16})>?\]?[ \t]*(\S*)")


def summary(dump: str) -> str:
    """One line from what Xen printed after its debug keys were pressed (``dump``: untrusted console text)."""
    if ANSWERED not in dump:
        return ("Xen did not answer its debug keys on the serial console (it handles them in an interrupt: Xen "
                "itself was stuck)")
    said: list[str] = []
    lines = dump.splitlines()
    for at, line in enumerate(lines):
        state = STATE.search(line)
        if state is None:
            continue
        where = next((m for m in map(WHERE.search, lines[at + 1:at + 6]) if m), None)
        if where is None:
            continue
        host, guest, vcpu, running = state.group(2, 3, 4, 5)
        who = (f"pCPU{host}" if host is not None else f"pCPU{guest} in {running}" if guest is not None
               else f"dom0 vCPU{vcpu}")
        symbol = re.sub(r"[^\w.+/#-]", "?", where.group(2))[:80].split("#")[-1]  # (the function is enough)
        said.append(f"{who} at {symbol or where.group(1)}")
    return "; ".join(said)[:1500] or "Xen answered its debug keys but dumped no CPU state"
