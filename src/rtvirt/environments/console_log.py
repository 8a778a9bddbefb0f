"""Every guest's console kept in its run directory (``console.log`` in the guest's work directory): what a guest
said is the only account of why it stopped (an out-of-memory kill, a panic), for a disturbing guest as for the
measuring one. The text is the guest's (untrusted): kept as printable text, and bounded to its beginning (the
boot) and its end (how it stopped), with how much was left out between them."""

from __future__ import annotations

import re
from pathlib import Path

from ..fileio import write_atomically

__all__ = ["CONSOLE_FILE", "CONSOLE_HEAD_BYTES", "CONSOLE_TAIL_BYTES", "HEAD_AND_TAIL", "keep_console",
           "bound_console_file", "printable"]

CONSOLE_FILE = "console.log"
CONSOLE_HEAD_BYTES = 64 << 10
CONSOLE_TAIL_BYTES = 192 << 10
LEFT_OUT = "\n[rtvirt: {bytes} bytes of this console left out here]\n"
# The same bound where the console lives on another machine (a Xen domU's log in dom0): the file's beginning, a
# line saying how much was left out, its end. "$1": the log; the sizes are ours.
HEAD_AND_TAIL = (r'f=$1; n=$(wc -c < "$f") || exit 1; if [ "$n" -le $(($2 + $3)) ]; then cat "$f"; else '
                 r'head -c "$2" "$f"; printf "\n[rtvirt: %s bytes of this console left out here]\n" '
                 r'$((n - $2 - $3)); tail -c "$3" "$f"; fi')
_UNPRINTABLE = re.compile(r"[^\t\n\x20-\x7e\u00a0-\ufffc]")


def printable(data: bytes) -> str:
    """A console's bytes as text a terminal or a page shows as written: no control sequences (each becomes ?)."""
    return _UNPRINTABLE.sub("?", data.decode("utf-8", errors="replace").replace("\r\n", "\n"))


def keep_console(path: Path, data: bytes) -> None:
    """Keep ``data`` (a console, possibly already bounded elsewhere) at ``path``, bounded and printable."""
    if len(data) > CONSOLE_HEAD_BYTES + CONSOLE_TAIL_BYTES + len(LEFT_OUT) + 20:
        data = (data[:CONSOLE_HEAD_BYTES]
                + LEFT_OUT.format(bytes=len(data) - CONSOLE_HEAD_BYTES - CONSOLE_TAIL_BYTES).encode()
                + data[-CONSOLE_TAIL_BYTES:])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, printable(data))


def bound_console_file(path: Path) -> None:
    """Bound and clean the console a hypervisor wrote to ``path`` as the guest ran (nothing there: nothing kept)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(CONSOLE_HEAD_BYTES)
            if size > CONSOLE_HEAD_BYTES + CONSOLE_TAIL_BYTES:
                f.seek(size - CONSOLE_TAIL_BYTES)
                data = head + LEFT_OUT.format(bytes=size - len(head) - CONSOLE_TAIL_BYTES).encode() + f.read()
            else:
                data = head + f.read()
    except FileNotFoundError:
        return
    write_atomically(path, printable(data))
