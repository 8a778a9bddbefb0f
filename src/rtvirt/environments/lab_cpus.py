"""What a hung lab's CPUs were doing, as the QEMU that emulates them sees it.

A lab that stops answering may say nothing on its console: in a CI run the KVM lab's kernel printed nothing for
119 s, not even the stall panics it is booted with, so neither of its CPUs ran its kernel's timer interrupts.
Only the emulator can tell then. Each lab's QEMU gets a QMP socket (``LabMachine.monitor_args``); on a hang rtvirt asks
it for every CPU's registers a few times, half a second apart (``info registers -a``), and reads how busy each of
QEMU's CPU threads was meanwhile (/proc). A CPU whose program counter stays put while its thread is busy spins in
place; one whose thread is idle waits. Addresses are named against the lab kernel's text symbols and its modules'
load addresses, read from the lab once it is up (Debian's System.map is a stub; the lab boots ``nokaslr``, so its
kernel's symbols are where they were in the lab's first boot, and are kept for later ones, a boot that hangs
included); an address in neither is code the lab's kernel does not own (a nested guest's, Xen's).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..procs import cpu_ticks

__all__ = ["KernelSymbols", "cpu_report"]

SAMPLES, SAMPLE_GAP_S = 3, 0.5
QMP_TIMEOUT_S = 5.0
STACK_WORDS, STACK_NAMED = 64, 8  # words read from the top of a CPU's stack; kernel functions they name, kept
OUTSIDE = "not the lab kernel's"
DUMP_LIMIT = 64 << 10  # bytes of each `info registers -a` answer kept (it is the lab's state: bounded)
# where a section of the kernel's text starts or ends: the same address as a function, which names it better
_SECTION_MARK = re.compile(r"^_+\w*_(start|end)$|^_[se](init)?text$")
_CPU_HEADER = re.compile(r"^CPU#(\d+)$", re.M)
_PC = re.compile(r"(?:^|\s)(?:RIP|EIP|PC)=([0-9a-f]+)", re.M)
_X86_STATE = re.compile(r"[RE]FL=([0-9a-f]+) .*?CPL=(\d).*?HLT=(\d)")
_ARM_STATE = re.compile(r"PSTATE=([0-9a-f]+) \S+ (EL\d[ht])")


@dataclass
class KernelSymbols:
    """The lab kernel's text symbols (System.map's format: /proc/kallsyms) and its modules' ranges (/proc/modules),
    to name an address."""

    addresses: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    modules: list[tuple[int, int, str]] = field(default_factory=list)  # (start, size, name)

    @classmethod
    def read(cls, kallsyms: Path | None) -> KernelSymbols:
        """The text symbols of ``kallsyms`` (none when there is no such file)."""
        symbols = cls()
        if kallsyms is not None and kallsyms.exists():
            for line in kallsyms.read_text(errors="replace").splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[1] in ("t", "T") and not _SECTION_MARK.match(parts[2]):
                    symbols.addresses.append(int(parts[0], 16))
                    symbols.names.append(re.sub(r"[^\w.]", "?", parts[2])[:80])  # (the lab's: untrusted)
            order = sorted(range(len(symbols.addresses)), key=symbols.addresses.__getitem__)
            symbols.addresses = [symbols.addresses[i] for i in order]
            symbols.names = [symbols.names[i] for i in order]
        return symbols

    def add_modules(self, proc_modules: str) -> None:
        """The modules' ranges of a /proc/modules text (a boot's own: modules load anywhere)."""
        for line in proc_modules.splitlines():  # name size refcount users state address
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith("0x") and parts[1].isdigit():
                self.modules.append((int(parts[5], 16), int(parts[1]), re.sub(r"[^\w-]", "?", parts[0])[:40]))

    def name(self, address: int) -> str | None:
        """``symbol+offset`` or ``module+offset`` for ``address``; "not the lab kernel's" outside both, and None
        when nothing was read to name it by."""
        if not self.addresses and not self.modules:
            return None
        for start, size, module in self.modules:
            if start <= address < start + size:
                return f"{module}+{address - start:#x}"
        at = bisect.bisect_right(self.addresses, address) - 1
        # (a text symbol more than 64 KiB below the address: past the kernel's text, not in it)
        if at >= 0 and address - self.addresses[at] < 1 << 16:
            return f"{self.names[at]}+{address - self.addresses[at]:#x}"
        return OUTSIDE


def _qmp(sock: Path, command: str, cpu: int | None = None) -> str:
    """``command``'s answer from the human monitor (on CPU ``cpu``: registers in it are that CPU's), through the
    QMP socket ``sock``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(QMP_TIMEOUT_S)
        conn.connect(str(sock))
        stream = conn.makefile("rwb")
        stream.readline()  # the greeting
        for request in ({"execute": "qmp_capabilities"},
                        {"execute": "human-monitor-command",
                         "arguments": {"command-line": command, **({} if cpu is None else {"cpu-index": cpu})}}):
            stream.write(json.dumps(request).encode() + b"\n")
            stream.flush()
            while True:  # (events may come before the answer)
                answer = json.loads(stream.readline(DUMP_LIMIT * 4) or b"{}")
                if "return" in answer or "error" in answer or not answer:
                    break
        if "return" not in answer:
            raise OSError(f"QMP refused {command!r}: {str(answer.get('error', 'no answer'))[:200]}")
        return str(answer["return"])[:DUMP_LIMIT]


def _cpu_states(dump: str) -> dict[int, tuple[int, str]]:
    """CPU number -> (program counter, its state in words) from one `info registers -a`."""
    states: dict[int, tuple[int, str]] = {}
    dump = dump.replace("\r\n", "\n")
    headers = list(_CPU_HEADER.finditer(dump))
    for header, after in zip(headers, [*headers[1:], None], strict=True):
        block = dump[header.end():after.start() if after else len(dump)]
        pc = _PC.search(block)
        if pc is None:
            continue
        x86, arm = _X86_STATE.search(block), _ARM_STATE.search(block)
        if x86:
            flags = int(x86.group(1), 16)
            state = f"CPL {x86.group(2)}, interrupts {'on' if flags & 0x200 else 'off'}" + (
                ", halted" if x86.group(3) == "1" else "")
        else:
            state = f"{arm.group(2)}, interrupts {'off' if int(arm.group(1), 16) & 0x80 else 'on'}" if arm else "?"
        states[int(header.group(1))] = (int(pc.group(1), 16), state)
    return states


def _place(pc: int, symbols: KernelSymbols) -> str:
    name = symbols.name(pc)
    return f"{pc:x}" if name is None else f"{pc:x} ({name})"


def _thread_ticks(pid: int) -> dict[str, int]:
    """QEMU's CPU threads ("CPU 0/TCG", "CPU 1/KVM") -> the clock ticks each has run."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            comm = (task / "comm").read_text().strip()
            if comm.startswith("CPU "):
                ticks[comm.split("/")[0]] = cpu_ticks((task / "stat").read_text())
        except (OSError, IndexError):  # (a thread that ended meanwhile)
            continue
    return ticks


def cpu_report(sock: Path, qemu_pid: int, symbols: KernelSymbols) -> tuple[str, str]:
    """(a clause ending in "; " on where each of the lab's CPUs was and how busy QEMU kept it, the registers as
    QEMU dumped them), asked of the QEMU whose QMP socket is ``sock``; ("", "") when it cannot be asked (no
    socket, QEMU gone)."""
    if not sock.exists():
        return "", ""
    dumps: list[str] = []
    before, started = _thread_ticks(qemu_pid), time.monotonic()
    try:
        for sample in range(SAMPLES):
            if sample:
                time.sleep(SAMPLE_GAP_S)
            dumps.append(_qmp(sock, "info registers -a"))
    except (OSError, ValueError) as exc:
        return f"its QEMU did not say where its CPUs were ({str(exc)[:120]}); ", "\n".join(dumps)
    after, spent = _thread_ticks(qemu_pid), max(time.monotonic() - started, 1e-3)
    samples = [_cpu_states(dump) for dump in dumps]
    parts = []
    for cpu in sorted(samples[-1]):
        seen = [states[cpu] for states in samples if cpu in states]
        places = list(dict.fromkeys(_place(pc, symbols) for pc, _ in seen))
        where = places[0] if len(places) == 1 else f"{len(places)} places: " + ", ".join(places)
        busy = after.get(f"CPU {cpu}", 0) - before.get(f"CPU {cpu}", 0)
        thread = f", its QEMU thread busy {100 * busy / os.sysconf('SC_CLK_TCK') / spent:.0f} %" \
            if f"CPU {cpu}" in after else ""
        parts.append(f"CPU {cpu} at {where}, {seen[-1][1]}{thread}")
    said = "; ".join(parts) or "no CPU in QEMU's answer"
    stacks = _stacks(sock, sorted(samples[-1]), symbols)
    return (f"QEMU saw its CPUs ({SAMPLES} looks {SAMPLE_GAP_S} s apart): {said}; "
            + "".join(f"CPU {cpu}'s stack holds {', '.join(named)}; " for cpu, named, _ in stacks if named),
            "\n".join([*(f"--- info registers -a, look {n + 1} ---\n{dump}" for n, dump in enumerate(dumps)),
                       *(f"--- CPU {cpu}: x /{STACK_WORDS}gx $esp ---\n{words}" for cpu, _, words in stacks)]))


def _stacks(sock: Path, cpus: list[int], symbols: KernelSymbols) -> list[tuple[int, list[str], str]]:
    """For each of ``cpus`` (x86, where the lab kernel's symbols were read): the kernel functions its stack's top
    STACK_WORDS words name, innermost first (return addresses among them: a backtrace with some noise), and the
    words as QEMU printed them."""
    if not symbols.addresses:
        return []
    stacks = []
    for cpu in cpus:
        try:  # ($esp: the monitor's name for the whole stack pointer, RSP included)
            words = _qmp(sock, f"x /{STACK_WORDS}gx $esp", cpu).replace("\r\n", "\n")
        except (OSError, ValueError):
            continue
        named = [symbols.name(int(word, 16)) for word in re.findall(r"\b0x([0-9a-f]{16})\b", words)]
        kernel = [name for name in named if name and name != OUTSIDE]
        stacks.append((cpu, list(dict.fromkeys(kernel))[:STACK_NAMED], words))
    return stacks
