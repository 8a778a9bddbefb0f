"""Where a hung lab's CPUs were, as its QEMU saw them (environments.lab_cpus), against a real QEMU: its QMP
socket's registers, its CPU threads' business, and the names the lab kernel's own System.map gives addresses."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rtvirt.environments.lab_cpus import QMP_SOCKET, KernelSymbols, cpu_report, monitor_args

QEMU = shutil.which("qemu-system-x86_64")


@pytest.mark.vm
def test_a_machine_in_its_firmware_is_seen_cpu_by_cpu_with_its_threads_business(tmp_path: Path) -> None:
    assert QEMU is not None
    # two CPUs, no disk: the firmware idles CPU 0 and parks CPU 1 (both halted, neither thread busy)
    proc = subprocess.Popen([QEMU, "-accel", "tcg", "-smp", "2", "-display", "none", "-nodefaults",
                             *monitor_args(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / QMP_SOCKET).exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        time.sleep(2)  # (past the firmware's start)
        said, dump = cpu_report(tmp_path, proc.pid, KernelSymbols())
        # a symbol table whose one "function" spans the first 64 KiB: the firmware's stack words name it
        low = KernelSymbols(addresses=[0], names=["low_64k"])
        low_said, low_dump = cpu_report(tmp_path, proc.pid, low)
    finally:
        proc.kill()
        proc.wait()
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
    assert cpu_report(tmp_path / "elsewhere", proc.pid, KernelSymbols()) == ("", "")


def test_addresses_are_named_by_a_kernels_symbols_and_its_modules(tmp_path: Path) -> None:
    # this machine's own kernel's symbols, in the form the lab's are kept (text symbols of /proc/kallsyms)
    kallsyms = tmp_path / "kallsyms.txt"
    kallsyms.write_text("".join(line for line in Path("/proc/kallsyms").read_text().splitlines(keepends=True)
                                if line.split()[1] in ("t", "T") and "[" not in line)
                        + "ffffffffff000000 T evil\x1b[31m;name\n")  # (a lab's symbol names are untrusted)
    line = next(line for line in kallsyms.read_text().splitlines() if line.endswith(" default_idle"))
    idle = int(line.split()[0], 16)
    assert idle != 0  # (root reads the real addresses)
    symbols = KernelSymbols.read(kallsyms, "kvm_amd 192512 0 - Live 0xffffffffc0a00000\n"
                                             "evil$name 4096 0 - Live 0xffffffffc0b00000\n")
    assert symbols.name(idle + 0x12) == "default_idle+0x12"
    assert symbols.name(0xffffffffc0a00000 + 0x345) == "kvm_amd+0x345"
    assert symbols.name(0xffffffffc0b00010) == "evil?name+0x10"  # (the module's name is the lab's: untrusted)
    assert symbols.name(0x7f0000001000) == "not the lab kernel's"  # (a nested guest's user space, say)
    assert KernelSymbols().name(idle) is None  # nothing read: the address alone
    assert symbols.name(0xffffffffff000004) == "evil??31m?name+0x4"


def test_no_socket_where_its_path_would_not_fit(tmp_path: Path) -> None:
    named = ["-name", "rtvirt-lab,debug-threads=on"]
    assert monitor_args(tmp_path) == [*named, "-qmp", f"unix:{tmp_path / QMP_SOCKET},server=on,wait=off"]
    assert monitor_args(tmp_path / ("d" * 120)) == named and monitor_args(tmp_path / "a,b") == named
