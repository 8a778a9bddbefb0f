"""Where a hung lab's CPUs were, as its QEMU saw them (environments.lab_cpus), against a real QEMU: its QMP
socket's registers, its CPU threads' business, and the names a kernel's text symbols give addresses."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from rtvirt.environments.lab_cpus import KernelSymbols, cpu_report
from rtvirt.environments.lab_machine import QMP_SOCKET, LabMachine, free_port
from rtvirt.procs import Supervisor

QEMU = shutil.which("qemu-system-x86_64")


@pytest.mark.vm
def test_a_machine_in_its_firmware_is_seen_cpu_by_cpu_with_its_threads_business(tmp_path: Path) -> None:
    assert QEMU is not None
    # a lab's QEMU with two CPUs and nothing to boot: the firmware idles CPU 0 and parks CPU 1 (both halted,
    # neither thread busy)
    with Supervisor() as supervisor:
        lab = LabMachine(supervisor, 60 * 10**9)
        try:
            lab.start([QEMU, "-accel", "tcg", "-smp", "2", "-display", "none", "-nodefaults", *lab.monitor_args()],
                      free_port())
            sock, pid = lab.directory / QMP_SOCKET, int((lab.directory / "qemu.pid").read_text())
            deadline = time.monotonic() + 30
            while not sock.exists():
                assert lab.alive() and time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(2)  # (past the firmware's start)
            said, dump = cpu_report(sock, pid, KernelSymbols())
            # a symbol table whose one "function" spans the first 64 KiB: the firmware's stack words name it
            low = KernelSymbols(addresses=[0], names=["low_64k"])
            low_said, low_dump = cpu_report(sock, pid, low)
        finally:
            lab.close()
    assert said.startswith("QEMU saw its CPUs (3 looks 0.5 s apart): CPU 0 at "), said
    cpus = re.findall(r"CPU (\d) at ([0-9a-f]+), CPL 0, interrupts (?:on|off), halted, its QEMU thread busy (\d+) %",
                      said)
    assert [cpu for cpu, _, _ in cpus] == ["0", "1"], said
    assert all(int(busy) < 50 for _, _, busy in cpus), said  # halted CPUs: their threads wait
    assert dump.count("CPU#0") == 3 and dump.count("CPU#1") == 3 and "EIP=" in dump, dump[:500]
    # no symbols, no stacks; with them, each CPU's top 64 stack words, read from QEMU, and what they name
    assert "stack" not in said and "x /64gx" not in dump
    for cpu in (0, 1):
        words = low_dump.split(f"--- CPU {cpu}: x /64gx $esp ---\n", 1)[1].split("\n---", 1)[0]
        assert len(re.findall(r"\b0x[0-9a-f]{16}\b", words)) == 64, words
    assert re.search(r"CPU 0's stack holds low_64k\+0x[0-9a-f]+", low_said), low_said
    # QEMU gone: nothing to say, and nothing raised
    assert cpu_report(sock, pid, KernelSymbols()) == ("", "")


def test_addresses_are_named_by_a_kernels_symbols_and_its_modules(tmp_path: Path) -> None:
    # this machine's own kernel's symbols, in the form the lab's are kept (text symbols of /proc/kallsyms)
    kallsyms = tmp_path / "kallsyms.txt"
    kallsyms.write_text("".join(line for line in Path("/proc/kallsyms").read_text().splitlines(keepends=True)
                                if line.split()[1] in ("t", "T") and "[" not in line)
                        + "ffffffffff000000 T evil\x1b[31m;name\n")  # (a lab's symbol names are untrusted)
    line = next(line for line in kallsyms.read_text().splitlines() if line.endswith(" default_idle"))
    idle = int(line.split()[0], 16)
    assert idle != 0  # (root reads the real addresses)
    symbols = KernelSymbols.read(kallsyms)
    symbols.add_modules("kvm_amd 192512 0 - Live 0xffffffffc0a00000\nevil$name 4096 0 - Live 0xffffffffc0b00000\n")
    assert symbols.name(idle + 0x12) == "default_idle+0x12"
    assert symbols.name(0xffffffffc0a00000 + 0x345) == "kvm_amd+0x345"
    assert symbols.name(0xffffffffc0b00010) == "evil?name+0x10"  # (the module's name is the lab's: untrusted)
    assert symbols.name(0x7f0000001000) == "not the lab kernel's"  # (a nested guest's user space, say)
    assert KernelSymbols().name(idle) is None  # nothing read: the address alone
    assert symbols.name(0xffffffffff000004) == "evil??31m?name+0x4"


def test_no_socket_where_its_path_would_not_fit(tmp_path: Path) -> None:
    named = ["-name", "rtvirt-lab,debug-threads=on"]
    with Supervisor() as supervisor:
        lab = LabMachine(supervisor, 60 * 10**9)
        own = lab.directory
        try:
            assert lab.monitor_args() == [*named, "-qmp", f"unix:{own / QMP_SOCKET},server=on,wait=off"]
            for directory in (tmp_path / ("d" * 120), tmp_path / "a,b"):  # (the console's socket goes alike)
                lab.directory = directory
                assert lab.monitor_args() == named and lab.serial_args()[0] == "-serial", directory
        finally:
            lab.directory = own
            lab.close()
    assert not own.exists()
