"""xen: the workload in a Xen domU, created with ``xl`` in dom0.

dom0 is either this machine (rtvirt runs in a Xen host's dom0: ``xl`` runs locally) or a Xen lab
(xen_lab.py: Xen and a small dom0 booted in QEMU, ``xl`` driven over SSH). Both go through the same
:class:`Dom0` with a different transport, so everything below is "xl in dom0".

A run creates the measuring domU paused (``xl create -p``), puts it in the scenario's cpupool, applies
the scheduler parameters, reads every setting back from ``xl`` into the manifest and only then unpauses
it. Samples leave the domU live over its vif: the probe's stdout goes through busybox ``nc`` to a
listener in dom0, whose output is the run's stream file (over SSH in the lab). Domains and cpupools
carry rtvirt's name prefix so that a killed campaign's leftovers are recognised and removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import InputError, RunError
from ..params import CpuList
from ..procs import Supervisor, terminate_group
from ..units import duration_field
from . import baremetal
from .base import Environment, EnvironmentConfig, Launched, SharedResources
from .guest_image import (
    EXIT_MARK,
    GUEST_AGENT_DIR,
    READY_MARK,
    GuestImage,
    GuestJob,
    GuestKind,
    guest_description,
    guest_field,
    guest_image,
    job_archive,
)
from .xen_lab import (
    A653_TOOL,
    DOM0_LINK_ADDRESS,
    DOMU_INITRAMFS,
    DOMU_KERNEL,
    VIF_HOTPLUG,
    VIF_SCRIPT,
    XenLab,
    XenLabConfig,
)

__all__ = ["NAME_PREFIX", "Arinc653Params", "CreditParams", "RtdsParams", "XenConfig", "XenEnvironment"]

NAME_PREFIX = "rtvirt-"
DEFAULT_POOL = "Pool-0"
RUN_DIR = "/run/rtvirt"
CONSOLE_LOG = "/var/log/xen/guest-{name}.log"
CONSOLE_TAIL_BYTES = 16384
UNAME_MARK = "RTVIRT-UNAME"
STREAM_PORT_BASE = 7100
STATUS_INTERVAL_S = 1.0  # how often a running domain's console is read (each read is a dom0 command)
XL_TIMEOUT_S = 120.0
SELF_DESTROY_WAIT_S = 15.0
LAB_WARNING = ("nested Xen under {accel} (a Xen lab in QEMU on this machine): its timings are not representative "
               "of a Xen host")

# The measuring domU's main job: bring up its vif, then pipe the probe's stream to dom0's listener.
# Only numbers and addresses we chose reach the script as $1..$3; the agent's argv follows verbatim as "$@".
STREAM_SCRIPT = r"""set -o pipefail
dom0=$1 self=$2 port=$3
shift 3
n=0
until [ -e /sys/class/net/eth0 ]; do
  n=$((n+1)); [ $n -gt 300 ] && { echo "rtvirt: no vif" >&2; exit 70; }; sleep 0.1
done
ip link set lo up
ip link set eth0 up
ip addr add "$self/32" dev eth0
ip route add "$dom0/32" dev eth0
echo "RTVIRT-UNAME $(uname -r) $(uname -v)" >&2
"$@" | nc "$dom0" "$port"
"""

# cpupool ids by name, as "ID NAME" lines (libxl keeps them in xenstore; xl prints names only)
POOL_IDS_SCRIPT = ('for i in $(seq 0 63); do n=$(xenstore-read /local/pool/$i/name 2>/dev/null) && echo "$i $n"; '
                   'done; exit 0')
POOL_DESTROY_S = 30.0


def _us(ns: int) -> int:
    return ns // 1000


class RtdsParams(BaseModel):
    """One vCPU's RTDS reservation: ``budget`` of CPU time every ``period``."""

    model_config = ConfigDict(extra="forbid")
    period: duration_field("us") = Field(10_000_000, ge=100_000, le=10_000_000_000,  # type: ignore[valid-type]
                                         description="replenishment period (bare numbers in us)")
    budget: duration_field("us") = Field(4_000_000, ge=100_000,  # type: ignore[valid-type]
                                         description="CPU time per period (bare numbers in us)")
    extratime: bool = Field(False, description="let the vCPU run beyond its budget when the pCPU is idle")

    @model_validator(mode="after")
    def _budget_fits(self) -> RtdsParams:
        if self.budget > self.period:
            raise ValueError("budget must not exceed period")
        if self.budget % 1000 or self.period % 1000:
            raise ValueError("budget and period are whole microseconds (xl sched-rtds takes us)")
        return self

    def xl_args(self) -> list[str]:
        return ["-p", str(_us(self.period)), "-b", str(_us(self.budget)), "-e", "1" if self.extratime else "0"]


class CreditParams(BaseModel):
    """credit/credit2 share of a domain: ``weight`` relative to others, ``cap`` in % of one pCPU (0: none)."""

    model_config = ConfigDict(extra="forbid")
    weight: int = Field(256, ge=1, le=65535)
    cap: int = Field(0, ge=0, le=6400)


class Arinc653Params(BaseModel):
    """An ARINC 653 major frame: the measuring domU's window(s) first, then the disturbing domUs' windows."""

    model_config = ConfigDict(extra="forbid")
    major_frame: duration_field("ms") = Field(10_000_000, ge=100_000, le=10_000_000_000,  # type: ignore[valid-type]
                                              description="length of the repeating major frame (bare numbers in ms)")
    window: duration_field("ms") = Field(5_000_000, ge=10_000,  # type: ignore[valid-type]
                                         description="the measuring domU's window per vCPU in each major frame; "
                                                     "disturbing domUs in the pool share the rest equally")

    @model_validator(mode="after")
    def _window_fits(self) -> Arinc653Params:
        if self.window > self.major_frame:
            raise ValueError("window must not exceed major_frame")
        return self


DEFAULT_A653 = Arinc653Params.model_validate({})


class XenConfig(EnvironmentConfig):
    kind: Literal["xen"] = "xen"
    where: Literal["auto", "dom0", "lab"] = Field(
        "auto", description="dom0: rtvirt runs in a Xen host's dom0; lab: Xen booted in QEMU here; "
                            "auto: dom0 when this is a Xen dom0, else lab")
    mode: Literal["pv", "pvh", "hvm"] = Field("pv", description="domU type (PVH and HVM need hvm and hap or "
                                                                "shadow in `xl info` virt_caps; HVM a device model)")
    vcpus: int = Field(1, ge=1, le=64, description="the measuring domU's vCPUs")
    memory: int = Field(256, ge=64, le=65536, description="the measuring domU's memory in MiB")
    affinity: list[CpuList] | None = Field(None, description="hard affinity of each vCPU (pCPU lists); default: "
                                                             "vCPU i on the i-th of cpus (cycling) when pin")
    dom0_vcpus: int = Field(1, ge=1, le=64, description="dom0's vCPUs (lab: dom0_max_vcpus, pinned to pCPUs "
                                                        "0..n-1; dom0: xl vcpu-set, restored at the end)")
    scheduler: Literal["default", "credit", "credit2", "rtds", "arinc653", "null"] = Field(
        "default", description="default: the domU stays in Pool-0; otherwise a cpupool of this scheduler is made")
    pool_cpus: CpuList | None = Field(None, description="pCPUs moved into the cpupool (default: cpus, else the "
                                                        "last pCPU)")
    rtds: RtdsParams | None = Field(None, description="the reservation of every vCPU (scheduler rtds)")
    rtds_vcpus: list[RtdsParams] | None = Field(None, description="one reservation per vCPU instead (scheduler rtds)")
    credit: CreditParams | None = Field(None, description="weight and cap (scheduler credit or credit2)")
    arinc653: Arinc653Params | None = Field(None, description="major frame and windows (scheduler arinc653; "
                                                              "default: 10 ms frame, 5 ms window)")
    stressor_cpus: CpuList | None = Field(None, description="pCPUs of 'other-vm' disturbing domUs (default: the "
                                                            "measuring domU's; unpinned when pin = false)")
    stressor_memory: int = Field(128, ge=64, le=65536, description="memory of each disturbing domU in MiB")
    stressor_rtds: RtdsParams | None = Field(None, description="RTDS reservation of disturbing domUs in the "
                                                               "cpupool (default: Xen's)")
    lab: XenLabConfig = Field(default_factory=lambda: XenLabConfig.model_validate({}),
                              description="the emulated machine of a Xen lab")
    boot_timeout: duration_field("s") = Field(180_000_000_000, ge=1_000_000_000,  # type: ignore[valid-type]
                                              description="time a domU may take to boot (bare numbers in s)")
    guest: GuestKind = guest_field()

    @model_validator(mode="after")
    def _guest_the_lab_boots(self) -> XenConfig:
        if self.guest == "baremetal":  # our own kernel, booted as a PVH domU (docs/baremetal.md)
            if self.vcpus != 1:
                raise ValueError("vcpus: the bare-metal guest runs on one vCPU (vcpus = 1)")
            if "mode" in self.model_fields_set and self.mode != "pvh":
                raise ValueError("mode: the bare-metal guest boots as a PVH domU (mode = 'pvh')")
        return self  # linux and linux-rt: our guest image with that Debian kernel (Dom0.domu_files)

    @model_validator(mode="after")
    def _consistent(self) -> XenConfig:
        if self.affinity is not None and len(self.affinity) != self.vcpus:
            raise ValueError(f"affinity names {len(self.affinity)} vCPUs but vcpus is {self.vcpus}")
        if (self.rtds is not None or self.rtds_vcpus is not None) and self.scheduler != "rtds":
            raise ValueError("rtds parameters need scheduler = 'rtds'")
        if self.rtds is not None and self.rtds_vcpus is not None:
            raise ValueError("give rtds (every vCPU) or rtds_vcpus (one per vCPU), not both")
        if self.rtds_vcpus is not None and len(self.rtds_vcpus) != self.vcpus:
            raise ValueError(f"rtds_vcpus lists {len(self.rtds_vcpus)} reservations but vcpus is {self.vcpus}")
        if self.stressor_rtds is not None and self.scheduler != "rtds":
            raise ValueError("stressor_rtds needs scheduler = 'rtds'")
        if self.arinc653 is not None and self.scheduler != "arinc653":
            raise ValueError("arinc653 parameters need scheduler = 'arinc653'")
        if self.scheduler == "arinc653" and self.vcpus * (self.arinc653 or DEFAULT_A653).window > \
                (self.arinc653 or DEFAULT_A653).major_frame:
            raise ValueError("arinc653: vcpus x window exceeds major_frame")
        if self.where == "lab" and self.dom0_vcpus >= self.lab.pcpus:
            raise ValueError(f"dom0_vcpus ({self.dom0_vcpus}) leaves no pCPU of the lab's {self.lab.pcpus} for domUs")
        if self.credit is not None and self.scheduler not in ("credit", "credit2", "default"):
            raise ValueError("credit parameters need scheduler 'credit', 'credit2' or 'default'")
        return self


def is_dom0() -> bool:
    try:
        return "control_d" in Path("/proc/xen/capabilities").read_text()
    except OSError:
        return False


class _LocalProcess:
    """A dom0-side helper started locally, with the AgentProcess shape."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def error_tail(self) -> str:
        return ""

    def stop(self, grace: float = 5.0) -> int | None:
        return terminate_group(self.proc, grace)


class _LocalTransport:
    """dom0 is this machine: commands run as argument vectors, files are copied."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def run(self, argv: list[str], timeout: float = 60.0) -> Any:
        from ..remote import RemoteResult

        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RunError(f"dom0: {argv[0]} failed: {exc}") from None
        return RemoteResult(done.returncode, done.stdout.decode(errors="replace")[:1 << 20],
                            done.stderr.decode(errors="replace")[:1 << 20])

    def spawn(self, argv: list[str], stream_to: Path | None) -> _LocalProcess:
        sink = stream_to.open("wb") if stream_to is not None else subprocess.DEVNULL
        try:
            # stdin stays open (a pipe we hold, as the lab's SSH channel does): busybox nc shuts its socket's
            # sending side at EOF on stdin, the domU's nc then ends and the probe dies of a broken pipe
            return _LocalProcess(self.supervisor.start(argv, stdout=sink, stderr=subprocess.DEVNULL,
                                                       stdin=subprocess.PIPE))
        finally:
            if stream_to is not None:
                sink.close()  # type: ignore[union-attr]

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None:
        Path(remote).write_bytes(local.read_bytes())
        os.chmod(remote, mode)

    def close(self) -> None:
        pass


class Dom0:
    """xl in one dom0 (local or a lab's), shared by every run of a campaign."""

    def __init__(self, transport: Any, lab: XenLab | None, kernel: str, initramfs: str) -> None:
        self.transport = transport
        self.lab = lab
        # guest kernel flavour -> (kernel, initramfs) in dom0; a lab's image holds linux's
        self._domu: dict[str, tuple[str, str]] = {"linux": (kernel, initramfs)}
        self._hvm_ready = False
        self._count = 0
        self._info: str | None = None
        self.restore_dom0_vcpus: int | None = None
        self.vif_script = VIF_SCRIPT  # in the lab's dom0 image; a local dom0 gets it installed (_open_dom0)

    def a653_command(self) -> str:
        """The ARINC 653 schedule tool: in the lab's dom0 image, else compiled here (xen_lab.a653_tool)."""
        if self.lab is not None:
            return A653_TOOL
        from .xen_lab import a653_tool

        return str(a653_tool())

    def domu_files(self, flavour: str) -> tuple[str, str]:
        """(kernel, initramfs) in dom0 of a domU with the flavour's guest kernel; copied into a lab's dom0 on
        first use (its image holds linux's only: the others would cost every lab boot their size)."""
        if flavour not in self._domu:
            from .xen_lab import local_domu_files

            kernel, initramfs = local_domu_files(flavour)
            if self.lab is None:
                self._domu[flavour] = (str(kernel), str(initramfs))
            else:
                directory = f"{RUN_DIR}/domu-{flavour}"
                self.run(["mkdir", "-p", directory]).check("xen: dom0 mkdir")
                self.transport.put(kernel, f"{directory}/vmlinuz")
                self.transport.put(initramfs, f"{directory}/base.cpio")
                self._domu[flavour] = (f"{directory}/vmlinuz", f"{directory}/base.cpio")
        return self._domu[flavour]

    def hvm_support(self) -> None:
        """The device model and firmware HVM domUs need: a Xen host has them (qemu-system-xen); a lab's dom0 gets
        them on first use (xen_lab.hvm_archive, unpacked by busybox tar)."""
        if self.lab is None or self._hvm_ready:
            return
        from .xen_lab import hvm_archive

        self.transport.run(["tar", "-x", "-f", "-", "-C", "/"], timeout=600, input=hvm_archive()).check(
            "xen: copying the HVM device model into the lab's dom0")
        self._hvm_ready = True

    def next_index(self) -> int:
        self._count += 1
        return self._count

    def run(self, argv: list[str], timeout: float = XL_TIMEOUT_S) -> Any:
        return self.transport.run(argv, timeout=timeout)

    def xl(self, *args: str, what: str | None = None) -> str:
        result = self.run(["xl", *args])
        if result.returncode != 0:
            said = " ".join((result.stderr or result.stdout).split())[-300:] or f"status {result.returncode}"
            raise RunError(f"xl {what or args[0]}: {said}")
        return str(result.stdout)

    def info(self) -> str:
        if self._info is None:
            self._info = self.xl("info")[:8192]
        return self._info

    def domains(self) -> list[str]:
        return [line.split()[0] for line in self.xl("list").splitlines()[1:] if line.split()]

    def pools(self) -> dict[str, tuple[int, ...]]:
        """cpupool name -> its pCPUs."""
        pools: dict[str, tuple[int, ...]] = {}
        for line in self.xl("cpupool-list", "-c").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 2:
                pools[fields[0]] = tuple(int(c) for c in re.findall(r"\d+", fields[1])) if fields[1] != "any" else ()
        return pools

    def destroy_pool(self, name: str) -> None:
        cpus = self.pools().get(name, ())
        # a destroyed domain leaves its pool only once Xen has finished tearing it down
        deadline = time.monotonic() + POOL_DESTROY_S
        while (result := self.run(["xl", "cpupool-destroy", name])).returncode != 0:
            if time.monotonic() > deadline:
                said = " ".join((result.stderr or result.stdout).split())[-300:]
                raise RunError(f"xl cpupool-destroy {name}: {said or f'status {result.returncode}'}")
            time.sleep(0.5)
        for cpu in cpus:
            self.xl("cpupool-cpu-add", DEFAULT_POOL, str(cpu))

    def reclaim(self) -> list[str]:
        """Destroy domains and cpupools with rtvirt's prefix (left by a killed campaign)."""
        removed = []
        for name in self.domains():
            if name.startswith(NAME_PREFIX):
                self.xl("destroy", name)
                removed.append(f"domain {name}")
        for name in self.pools():
            if name.startswith(NAME_PREFIX):
                self.destroy_pool(name)
                removed.append(f"cpupool {name}")
        return removed

    def close(self) -> None:
        if self.restore_dom0_vcpus is not None:
            self.run(["xl", "vcpu-set", "0", str(self.restore_dom0_vcpus)])
            if self.lab is None:
                _bring_cpus_online(self.restore_dom0_vcpus)
        self.transport.close()
        if self.lab is not None:
            self.lab.close()


def _open_dom0(config: XenConfig, shared: SharedResources) -> Dom0:
    if _resolve_where(config) == "lab":
        def boot() -> Dom0:
            lab = XenLab(config.lab, config.dom0_vcpus, shared.supervisor)
            try:
                lab.boot()
            except BaseException:
                lab.close()
                raise
            return Dom0(lab.connection, lab, DOMU_KERNEL, DOMU_INITRAMFS)
        return shared.get(config.lab.key(config.dom0_vcpus), boot)

    def local() -> Dom0:
        from .xen_lab import local_domu_files

        problem = _console_log_problem()
        if problem:
            raise RunError(problem)
        kernel, initramfs = local_domu_files()
        dom0 = Dom0(_LocalTransport(shared.supervisor), None, str(kernel), str(initramfs))
        # a Xen host has no rtvirt-vif among its hotplug scripts: install ours where rtvirt keeps its files
        script = Path(RUN_DIR) / "rtvirt-vif"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(VIF_HOTPLUG)
        script.chmod(0o755)
        dom0.vif_script = str(script)
        # offline vCPUs are listed too (state "--p")
        online = sum("p" not in vcpu["state"] for vcpu in _vcpu_list(dom0.xl("vcpu-list", "0")))
        if online != config.dom0_vcpus:
            dom0.xl("vcpu-set", "0", str(config.dom0_vcpus))
            dom0.restore_dom0_vcpus = online
        return dom0
    return shared.get(f"xen-dom0:{config.dom0_vcpus}", local)


def _console_log_problem() -> str | None:
    """Why this dom0 cannot tell how a domU's job ended (None: it can). rtvirt reads the RTVIRT- marks from
    xenconsoled's guest logs; Debian's xencommons starts xenconsoled without them (XENCONSOLED_TRACE=none)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "xenconsoled":
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                pairs = [*args, *(f"{a}={b}" for a, b in zip(args, args[1:], strict=False) if a in ("--log", "-l"))]
                if any(arg in ("--log=guest", "--log=all", "-l=guest", "-l=all") for arg in pairs):
                    return None
                return (f"xen: this dom0's xenconsoled (pid {entry.name}) keeps no guest console logs, where rtvirt "
                        "reads how a domU's job ended: run it with --log=guest (Debian: XENCONSOLED_TRACE=guest in "
                        "/etc/default/xencommons, then restart xencommons)")
    return "xen: no xenconsoled runs in this dom0 (rtvirt reads the domUs' consoles from its guest logs)"


def _bring_cpus_online(count: int) -> None:
    """Bring this dom0's CPUs 1..count-1 online: ``xl vcpu-set`` gives them back to Linux, which only
    registers them; udev rules online them on a full Debian dom0, nothing does in a minimal one."""
    for cpu in range(1, count):
        control = Path(f"/sys/devices/system/cpu/cpu{cpu}/online")
        deadline = time.monotonic() + 10
        while not control.exists() and time.monotonic() < deadline:  # registered from a xenstore watch
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            if control.read_text().strip() == "0":
                control.write_text("1")


def _resolve_where(config: XenConfig) -> str:
    if config.where == "auto":
        return "dom0" if is_dom0() else "lab"
    return config.where


def _table(text: str) -> list[dict[str, str]]:
    """``xl``'s column output as rows keyed by header (the last column takes the rest of the line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = re.split(r"\s{1,}", lines[0].strip())
    rows = []
    for line in lines[1:]:
        values = line.split(None, len(header) - 1)
        rows.append(dict(zip(header, values, strict=False)))
    return rows


def _xl_info(text: str) -> dict[str, str]:
    """``xl info`` as key -> value (values bounded: they come from dom0)."""
    info = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and re.fullmatch(r"[a-z_0-9]+", key.strip()):
            info[key.strip()] = value.strip()[:512]
    return info


def _mode_refusal(mode: str, info: str) -> str | None:
    """Why this Xen cannot create ``mode`` domUs, from ``xl info``; None when it can. PVH and HVM domUs run
    on Xen's HVM side, which needs hardware virtualisation and paging for guests: HAP (EPT/NPT) or shadow
    paging (Debian's hypervisor is built without shadow paging)."""
    if mode == "pv":
        return None
    caps = _xl_info(info).get("virt_caps", "")
    words = set(caps.split())
    if "hvm" in words and words & {"hap", "shadow"}:
        return None
    return (f"mode = {mode!r}: this Xen cannot create {mode.upper()} domUs: xl info says virt_caps: {caps or '?'} "
            "(they need hvm and hap or shadow: VT-x/AMD-V with EPT/NPT, or a hypervisor with shadow paging); "
            "use mode = 'pv'")


def _vcpu_list(text: str) -> list[dict[str, str]]:
    """``xl vcpu-list``: its header ("Affinity (Hard / Soft)") does not split like its rows."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 9 and fields[-2] == "/":
            rows.append({"name": fields[0], "id": fields[1], "vcpu": fields[2], "cpu": fields[3],
                         "state": fields[4], "time_s": fields[5], "hard_affinity": fields[6],
                         "soft_affinity": fields[8]})
    return rows


class DomainProcess:
    """A domU's main job, with the AgentProcess shape: running until its console says how it ended."""

    def __init__(self, env: XenEnvironment, relay: Any | None) -> None:
        self.env = env
        self.relay = relay
        self._returncode: int | None = None
        self._why = ""
        self._checked = 0.0

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is not None:
            return self._returncode
        if self.relay is not None and self.relay.poll() is None:
            return None  # samples still flow: the job runs
        now = time.monotonic()
        if now - self._checked < STATUS_INTERVAL_S:
            return None
        self._checked = now
        status = self.env.exit_status()
        if status is not None:
            self._returncode = status
        elif not self.env.domain_exists():
            self._returncode, self._why = 255, "the domain stopped before its agent finished"
        return self._returncode

    def error_tail(self) -> str:
        said = [line for line in self.env.console_text().splitlines()
                if line.strip() and not line.startswith(("RTVIRT-", "["))]
        return "\n".join([*said[-5:], self._why]).strip()


class XenEnvironment(Environment):
    kind = "xen"
    config_model = XenConfig
    on_host = False
    config: XenConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dom0: Dom0 | None = None
        self._index = 0
        self._pool: str | None = None  # the cpupool this environment made (and removes)
        self._pool_cpus: tuple[int, ...] = ()
        self._domain: str | None = None
        self._process: DomainProcess | None = None
        self._relay: Any = None
        self._launched_at = 0.0
        self._ready_at: float | None = None
        self._console_checked = 0.0
        self._console = ""
        self._readback: dict[str, Any] = {}
        self._parent: XenEnvironment | None = None  # set on disturbing domUs: they share its pool
        self._pool_id: int | None = None
        self._beside: list[GuestJob] = []  # "inside" stressors: background jobs beside the workload
        self._image: GuestImage | None = None  # the measuring domU's guest image (linux, linux-rt)
        self._a653_domains: dict[str, list[tuple[str, int]]] = {}  # ARINC 653 pool owner: domain -> (UUID, vCPU)

    @staticmethod
    def available() -> str | None:
        if is_dom0():
            return None
        from .qemu import QEMU

        for tool, package in ((QEMU, "qemu-system-x86"), ("/usr/lib/xen-4.17/bin/xl", "xen-utils-4.17"),
                              ("/usr/sbin/sshd", "openssh-server"), ("ssh-keygen", "openssh-client")):
            if not (Path(tool).exists() if tool.startswith("/") else shutil.which(tool)):
                return f"the Xen lab needs {tool} (apt-get install {package}; scripts/setup.sh does)"
        return None

    @classmethod
    def reclaim(cls, config: EnvironmentConfig, shared: SharedResources) -> list[str]:
        assert isinstance(config, XenConfig)
        if _resolve_where(config) == "lab":
            from .xen_lab import reclaim_labs

            return reclaim_labs()  # a lab's domains and pools died with its QEMU
        return _open_dom0(config, shared).reclaim()

    # ---- placement ----

    def measured_cpus(self) -> tuple[int, ...]:
        # host CPUs: the lab's QEMU (or dom0's host) is not pinned; the domU's own pCPUs are in describe()
        return tuple(sorted(os.sched_getaffinity(0)))

    def probe_overrides(self) -> dict[str, Any]:
        return {"affinity": (0,)}

    def _pcpus(self) -> tuple[int, ...]:
        """pCPUs of the measuring domU: cpus, else the last pCPU (dom0 keeps the first ones)."""
        if self.config.cpus:
            return tuple(self.config.cpus)
        assert self._dom0 is not None
        match = re.search(r"^nr_cpus\s*:\s*(\d+)", self._dom0.info(), re.M)
        return (int(match.group(1)) - 1,) if match else (0,)

    def _vcpu_affinity(self) -> list[str] | None:
        if self._parent is not None:
            return self._stressor_affinity()
        if self.config.affinity is not None:
            return [",".join(map(str, cpus)) for cpus in self.config.affinity]
        if not self.config.pin:
            return None
        cpus = self._pcpus()
        return [str(cpus[i % len(cpus)]) for i in range(self.config.vcpus)]

    def _stressor_affinity(self) -> list[str] | None:
        assert self._parent is not None
        if not self.config.pin:
            return None
        cpus = self.config.stressor_cpus or self._parent._pcpus()
        return [",".join(map(str, cpus))]

    # ---- lifecycle ----

    def start(self) -> None:
        if self._dom0 is not None:
            return
        dom0 = self._parent._dom0 if self._parent is not None else _open_dom0(self.config, self.shared)
        assert dom0 is not None
        self._dom0 = dom0
        if dom0.lab is not None and not dom0.lab.alive():
            raise RunError(f"the Xen lab stopped: {dom0.lab.panic() or dom0.lab.console_tail()}")
        self._index = dom0.next_index()
        if self._parent is None:
            refusal = _mode_refusal(self._domain_type(), dom0.info())
            if refusal is not None:
                raise InputError(f"environment {self.config.label!r}: {refusal}")
        if self._parent is None and self.config.scheduler != "default":
            self._make_pool()

    def _domain_type(self) -> str:
        return "pvh" if self.config.guest == "baremetal" else self.config.mode

    def _make_pool(self) -> None:
        assert self._dom0 is not None
        cpus = tuple(self.config.pool_cpus or self._pcpus())
        pools = self._dom0.pools()
        name = f"{NAME_PREFIX}{self.config.scheduler}-{self._index}"
        for cpu in cpus:
            owner = next((pool for pool, members in pools.items() if cpu in members), None)
            if owner != DEFAULT_POOL:
                raise RunError(f"xen: pCPU {cpu} is not in {DEFAULT_POOL} (it is in {owner or 'no pool'})")
        if set(cpus) >= set(pools.get(DEFAULT_POOL, ())):
            raise RunError(f"xen: the cpupool cannot take every pCPU of {DEFAULT_POOL}: dom0 needs one")
        for cpu in cpus:
            self._dom0.xl("cpupool-cpu-remove", DEFAULT_POOL, str(cpu))
        self._pool, self._pool_cpus = name, cpus
        try:
            self._dom0.xl("cpupool-create", f'name="{name}"', f'sched="{self.config.scheduler}"',
                          f'cpus="{",".join(map(str, cpus))}"', what="cpupool-create")
        except RunError as exc:
            for cpu in cpus:
                self._dom0.run(["xl", "cpupool-cpu-add", DEFAULT_POOL, str(cpu)])
            self._pool = None
            hint = (" (the hypervisor lacks this scheduler: Debian's has credit and credit2 only)"
                    if self.config.scheduler in ("rtds", "arinc653", "null") else "")
            raise RunError(f"{exc}{hint}") from None

    def _domain_pool(self) -> str | None:
        if self._parent is None:
            return self._pool
        parent = self._parent
        if parent._pool is None:
            return None
        stressor_cpus = self.config.stressor_cpus if self.config.pin else None
        if stressor_cpus is None or set(stressor_cpus) <= set(parent._pool_cpus):
            return parent._pool
        return None

    def _flavour(self) -> str:
        """The guest kernel of this domU: the scenario's for the measuring one, Debian's for disturbing ones."""
        return self.config.guest if self._parent is None else "linux"

    def _domain_config(self, name: str, initrd: str | None, ip: str | None, boot: list[str] | None = None) -> str:
        """xl's configuration of the domU; ``boot`` replaces the lines that boot our Linux image."""
        assert self._dom0 is not None
        boot = boot or [f'type = "{self.config.mode}"', f'kernel = "{self._dom0.domu_files(self._flavour())[0]}"',
                        f'ramdisk = "{initrd}"', 'extra = "console=hvc0 rdinit=/init quiet"',
                        f"memory = {self.config.stressor_memory if self._parent else self.config.memory}"]
        lines = [f'name = "{name}"', *boot,
                 f"vcpus = {1 if self._parent else self.config.vcpus}",
                 'on_poweroff = "destroy"', 'on_reboot = "destroy"', 'on_crash = "destroy"']
        affinity = self._vcpu_affinity()
        if affinity is not None:
            lines.append("cpus = [" + ", ".join(f'"{cpus}"' for cpus in affinity) + "]")
        pool = self._domain_pool()
        if pool is not None:
            lines.append(f'pool = "{pool}"')
        if self._domain_type() == "hvm":  # a device model without display; the console is hvc0 as for PV
            lines += ["vnc = 0", "sdl = 0", 'vga = "none"']
        if ip is not None:
            # HVM: the paravirtual NIC only (type=vif), no emulated one beside it
            kind = "type=vif," if self._domain_type() == "hvm" else ""
            lines.append(f"vif = ['{kind}ip={ip},script={self._dom0.vif_script}']")
        return "\n".join(lines) + "\n"

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        self.start()
        assert self._dom0 is not None
        dom0 = self._dom0
        self.workdir.mkdir(parents=True, exist_ok=True)
        role = "stress" if self._parent is not None else "measure"
        name = f"{NAME_PREFIX}{self.config.label[:40]}-{role}-{self._index}"
        directory = f"{RUN_DIR}/{name}"
        if self.config.guest == "baremetal" and self._parent is None:
            return self._launch_baremetal(agent, args, out, name, directory)
        argv = [f"{GUEST_AGENT_DIR}/{agent}", *args]
        ip = None
        if out is not None:
            if self._index > 250:
                raise RunError("xen: more than 250 measuring domUs in one campaign")
            ip = f"10.213.0.{self._index + 1}"
            port = STREAM_PORT_BASE + self._index
            argv = ["/bin/sh", "-c", STREAM_SCRIPT, "rtvirt-stream", DOM0_LINK_ADDRESS, ip, str(port),
                    *argv, "--out=-"]
        local_jobs = self.workdir / "jobs.cpio"
        local_jobs.write_bytes(job_archive(GuestJob(argv), self._beside))
        local_config = self.workdir / "domain.cfg"
        dom0.run(["mkdir", "-p", directory]).check("xen: dom0 mkdir")
        self._domain = name  # from here on, close() destroys it
        dom0.transport.put(local_jobs, f"{directory}/jobs.cpio")
        if self._parent is None:
            self._image = guest_image(self._flavour())  # what the manifest says about the guest kernel
        dom0.run(["sh", "-c", 'cat "$1" "$2" > "$3"', "sh", dom0.domu_files(self._flavour())[1],
                  f"{directory}/jobs.cpio",
                  f"{directory}/initrd"]).check("xen: assembling the domU initramfs")
        if self._domain_type() == "hvm":
            dom0.hvm_support()
        local_config.write_text(self._domain_config(name, f"{directory}/initrd", ip))
        dom0.transport.put(local_config, f"{directory}/domain.cfg")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            self._relay = dom0.transport.spawn(["busybox", "nc", "-l", "-p", str(port)], stream_to=out)
            self._wait_listening(port)
        self._launched_at = time.monotonic()
        dom0.xl("create", "-p", f"{directory}/domain.cfg", what=f"create {name}")
        self._apply_scheduling(name)
        self._read_back(name)
        dom0.xl("unpause", name)
        self._process = DomainProcess(self, self._relay)
        return Launched(self._process, out)

    def _launch_baremetal(self, agent: str, args: list[str], out: Path | None, name: str,
                          directory: str) -> Launched:
        """Our own kernel as a PVH domU: the probe's argv on its command line, its stream framed on its console
        and split from dom0's console log (baremetal.XenConsoleRelay)."""
        assert self._dom0 is not None
        dom0 = self._dom0
        line = baremetal.command_line(agent, args)
        memory = self.config.memory if "memory" in self.config.model_fields_set else baremetal.XEN_MEMORY_MIB
        dom0.run(["mkdir", "-p", directory]).check("xen: dom0 mkdir")
        self._domain = name  # from here on, close() destroys it
        dom0.transport.put(baremetal.kernel_path(), f"{directory}/kernel")
        local_config = self.workdir / "domain.cfg"
        local_config.write_text(self._domain_config(name, None, None, baremetal.xen_domain_lines(
            f"{directory}/kernel", line, memory)))
        dom0.transport.put(local_config, f"{directory}/domain.cfg")
        log = CONSOLE_LOG.format(name=name)
        dom0.run(["rm", "-f", log]).check("xen: removing an old console log")  # a reused name's log is appended
        self._launched_at = time.monotonic()
        dom0.xl("create", "-p", f"{directory}/domain.cfg", what=f"create {name}")
        self._relay = baremetal.XenConsoleRelay(dom0.transport, log, name, self.workdir / "console.raw", out)
        self._apply_scheduling(name)
        self._read_back(name)
        dom0.xl("unpause", name)
        self._process = DomainProcess(self, self._relay)
        return Launched(self._process, out)

    def _wait_listening(self, port: int) -> None:
        assert self._dom0 is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listening = self._dom0.run(["busybox", "netstat", "-ltn"]).stdout
            if re.search(rf":{port}\s", listening):
                return
            if self._relay.poll() is not None:
                break
            time.sleep(0.2)
        raise RunError(f"xen: dom0's stream listener on port {port} did not start")

    def _apply_scheduling(self, name: str) -> None:
        assert self._dom0 is not None
        if self.config.scheduler == "arinc653" and self._domain_pool() is not None:
            owner = self._parent or self
            uuid, owner._pool_id = self._identity(name)
            vcpus = 1 if self._parent else self.config.vcpus
            owner._a653_domains[name] = [(uuid, vcpu) for vcpu in range(vcpus)]
            owner._set_a653()
        scheduler = self.config.scheduler if self._domain_pool() else self._default_scheduler()
        if self.config.credit is not None and self._parent is None and scheduler in ("credit", "credit2"):
            # libxl does not apply a config file's weight/cap in a pool of its own; xl sched-* does
            self._dom0.xl(f"sched-{scheduler}", "-d", name, "-w", str(self.config.credit.weight),
                          "-c", str(self.config.credit.cap))
        rtds = self._rtds_request()
        if rtds is not None and self._domain_pool() is not None:
            if isinstance(rtds, list):
                args = [arg for vcpu, params in enumerate(rtds) for arg in ["-v", str(vcpu), *params.xl_args()]]
            else:
                args = ["-v", "all", *rtds.xl_args()]
            self._dom0.xl("sched-rtds", "-d", name, *args)

    def _rtds_request(self) -> RtdsParams | list[RtdsParams] | None:
        if self._parent is not None:
            return self.config.stressor_rtds
        return self.config.rtds_vcpus or self.config.rtds

    def _identity(self, name: str) -> tuple[str, int]:
        """(UUID, cpupool id) of a domain in our pool: the UUID from ``xl list -v`` (``xl list -l`` cannot
        always read a domain's stored configuration), the pool's id, which xl never prints, from xenstore's
        /local/pool/ID/name."""
        assert self._dom0 is not None
        pool = self._domain_pool()
        listed = re.findall(r"^(\S+)\s.*?\b([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\b",
                            self._dom0.xl("list", "-v", name), re.M)
        uuid = next((found for domain, found in listed if domain == name), None)
        if uuid is None or pool is None:
            raise RunError(f"xen: xl list -v names no UUID for {name}")
        ids = self._dom0.run(["sh", "-c", POOL_IDS_SCRIPT]).check("xen: listing cpupool ids in xenstore")
        for line in ids.stdout.splitlines():
            pool_id, _, pool_name = line.partition(" ")
            if pool_name == pool and pool_id.isdigit():
                return uuid, int(pool_id)
        raise RunError(f"xen: cpupool {pool} is not in xenstore's /local/pool")

    def _a653_schedule(self) -> list[tuple[str, int, int]]:
        """(UUID, vCPU, runtime ns) windows: the measuring domU's first, the rest split among disturbers."""
        params = self.config.arinc653 or DEFAULT_A653
        mine = [entry for name, entries in self._a653_domains.items() if name == self._domain for entry in entries]
        others = [entry for name, entries in self._a653_domains.items() if name != self._domain
                  for entry in entries]
        schedule = [(uuid, vcpu, params.window) for uuid, vcpu in mine]
        rest = params.major_frame - params.window * len(mine)
        if others and rest > 0:
            schedule += [(uuid, vcpu, rest // len(others)) for uuid, vcpu in others]
        return schedule

    def _set_a653(self) -> None:
        assert self._dom0 is not None and self._pool_id is not None
        params = self.config.arinc653 or DEFAULT_A653
        args = [str(self._pool_id), str(params.major_frame)]
        for uuid, vcpu, runtime in self._a653_schedule():
            args += [uuid, str(vcpu), str(runtime)]
        self._dom0.run([self._dom0.a653_command(), *args]).check("xen: setting the ARINC 653 schedule")

    def _read_back(self, name: str) -> None:
        """Every applied setting as xl reports it; RTDS reservations are checked against the request."""
        assert self._dom0 is not None
        readback: dict[str, Any] = {"domain": name, "type": self._type_of(name),
                                    "pool": self._domain_pool() or DEFAULT_POOL,
                                    "vcpu_list": _vcpu_list(self._dom0.xl("vcpu-list", name))}
        if readback["type"] != self._domain_type():
            raise RunError(f"xen: {name} is a {readback['type'] or 'domain of unknown type'} domU, not the "
                           f"requested {self._domain_type()}")
        scheduler = self.config.scheduler if self._domain_pool() else self._default_scheduler()
        if scheduler == "rtds":
            rows = _table(self._dom0.xl("sched-rtds", "-d", name, "-v", "all"))
            readback["sched_rtds"] = rows
            rtds = self._rtds_request()
            wanted = rtds if isinstance(rtds, list) else [rtds] * len(rows) if rtds else []
            for row, params in zip(rows, wanted, strict=False):
                # extra time too: with it a vCPU runs on past its budget whenever the pCPU is free
                if (row.get("Period"), row.get("Budget"), row.get("Extratime")) != \
                        (str(_us(params.period)), str(_us(params.budget)), "yes" if params.extratime else "no"):
                    raise RunError(f"xen: {name} vCPU {row.get('VCPU')}: xl reports period/budget/extratime "
                                   f"{row.get('Period')}/{row.get('Budget')} us/{row.get('Extratime')}, not the "
                                   "requested reservation")
        elif scheduler in ("credit", "credit2"):
            rows = _table(self._dom0.xl(f"sched-{scheduler}", "-d", name))
            readback[f"sched_{scheduler}"] = rows
            credit = self.config.credit if self._parent is None else None
            if credit is not None and rows and (rows[0].get("Weight"), rows[0].get("Cap")) != \
                    (str(credit.weight), str(credit.cap)):
                raise RunError(f"xen: {name}: xl reports weight/cap {rows[0].get('Weight')}/{rows[0].get('Cap')}, "
                               "not the requested ones")
        elif scheduler == "arinc653":
            owner = self._parent or self
            shown = self._dom0.run([self._dom0.a653_command(), str(owner._pool_id)]).check(
                "xen: reading the ARINC 653 schedule")
            lines = shown.stdout.split("\n")
            frame = int(lines[0].split()[1])
            windows = [{"uuid": f[0], "vcpu": int(f[1]), "runtime_ns": int(f[2])}
                       for f in (line.split() for line in lines[1:]) if len(f) == 3]
            requested = [{"uuid": u, "vcpu": v, "runtime_ns": r} for u, v, r in owner._a653_schedule()]
            if windows != requested:
                raise RunError(f"xen: the ARINC 653 schedule Xen reports ({len(windows)} windows) is not the one "
                               "set")
            readback["arinc653"] = {"major_frame_ns": frame, "windows": windows}
        self._readback = readback

    def _type_of(self, name: str) -> str | None:
        """pv, pvh or hvm as libxl recorded it in xenstore (xl prints no domain type)."""
        assert self._dom0 is not None
        domid = self._dom0.xl("domid", name).strip()
        found = self._dom0.run(["xenstore-read", f"/libxl/{domid}/type"]) if domid.isdigit() else None
        return found.stdout.strip()[:16] if found is not None and found.returncode == 0 else None

    def _default_scheduler(self) -> str:
        assert self._dom0 is not None
        match = re.search(r"^xen_scheduler\s*:\s*(\S+)", self._dom0.info(), re.M)
        return match.group(1) if match else "unknown"

    # ---- while it runs ----

    def console_text(self) -> str:
        if isinstance(self._relay, baremetal.XenConsoleRelay):
            return self._relay.text()  # the text part of the console; the log also holds the stream
        if self._dom0 is None or self._domain is None:
            return ""
        result = self._dom0.run(["tail", "-c", str(CONSOLE_TAIL_BYTES), CONSOLE_LOG.format(name=self._domain)],
                                timeout=30)
        if result.returncode == 0:
            self._console = str(result.stdout)[-CONSOLE_TAIL_BYTES:]
        return self._console

    def _uname(self) -> str | None:
        """``uname -r -v`` as the measuring domU printed it (untrusted: printable ASCII, bounded)."""
        for line in self._console.splitlines():
            if line.startswith(UNAME_MARK + " "):
                return re.sub(r"[^ -~]", "?", line.removeprefix(UNAME_MARK + " ").strip())[:200]
        return None

    def exit_status(self) -> int | None:
        for line in self.console_text().splitlines():
            if line.startswith(EXIT_MARK):
                status = line.removeprefix(EXIT_MARK).strip()
                return int(status) if status.isdigit() else 255
        return None

    def _powered_off_by_itself(self) -> bool:
        """Whether the domU's agent ended and the domain powered off (on_poweroff = "destroy"), not stopped by us."""
        return self._process is not None and self._process.returncode is not None

    def _wait_gone(self, timeout_s: float) -> None:
        """Give xl's own monitor the time to finish destroying the domain rather than racing it with a second
        destroy (the suspected cause of an `xl` that once did not return within 120 s in the lab)."""
        deadline = time.monotonic() + timeout_s
        while self.domain_exists() and time.monotonic() < deadline:
            time.sleep(0.5)

    def domain_exists(self) -> bool:
        assert self._dom0 is not None and self._domain is not None
        return self._dom0.run(["xl", "domid", self._domain], timeout=30).returncode == 0

    def check(self) -> str | None:
        if self._dom0 is not None and self._dom0.lab is not None and not self._dom0.lab.alive():
            return f"the Xen lab stopped: {self._dom0.lab.panic() or self._dom0.lab.console_tail()}"
        if self._process is None:
            return None
        if not self.booted and time.monotonic() - self._launched_at > self.config.boot_timeout / 1e9:
            return f"the domU did not boot within {self.config.boot_timeout / 1e9:.0f}s"
        status = self._process.poll()
        if status not in (None, 0) and isinstance(self._relay, baremetal.XenConsoleRelay):
            failure = baremetal.failure_exception(self.console_text())
            if failure is not None:
                raise failure  # status 2 (a parameter the guest refused) is bad input: exit 2
        if status not in (None, 0):
            return f"the domU's agent failed (status {status}): {self._process.error_tail()[-200:]}"
        return None

    @property
    def booted(self) -> bool:
        if self._ready_at is None and self._process is not None:
            now = time.monotonic()
            if now - self._console_checked >= STATUS_INTERVAL_S:
                self._console_checked = now
                if READY_MARK in self.console_text():
                    self._ready_at = now
        return self._ready_at is not None

    def add_guest_job(self, agent: str, args: list[str]) -> None:
        if self._process is not None:  # the jobs are in the initramfs: they cannot join a running domU
            raise RunError(f"{self.config.label}: a stressor inside the domU starts with it: give its disturbance "
                           "start_order = ['stress-first'] and no events")
        self._beside.append(GuestJob([f"{GUEST_AGENT_DIR}/{agent}", *args]))

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        """Another domU of the same Xen; its pCPUs come from ``stressor_cpus`` (host CPUs mean nothing to Xen)."""
        config = self.config.model_copy(update={"name": f"{self.config.label[:40]}-stress{index}"})
        domu = XenEnvironment(config, self.supervisor, self.workdir / f"stress-vm-{index}", self.shared)
        domu._parent = self
        return domu

    # ---- records ----

    def platform_audit(self) -> dict[str, Any]:
        dom0 = self._dom0
        if dom0 is None or self._parent is not None or (dom0.lab is not None and not dom0.lab.alive()):
            return {}  # a disturbing domU's parent audits the host; a dead lab has nothing left to ask
        return {"kind": "xen", "xl_info": _xl_info(dom0.info())}

    def describe(self) -> dict[str, Any]:
        description: dict[str, Any] = {**super().describe(), "where": _resolve_where(self.config)}
        if self._parent is None:
            description.update(guest_description(self.config.guest, self._image), guest_uname=self._uname())
        if self._dom0 is not None:
            if self._parent is None:
                description["cpupools"] = _table(self._dom0.xl("cpupool-list")) if self._dom0.lab is None or \
                    self._dom0.lab.alive() else []
            if self._dom0.lab is not None:
                lab = self._dom0.lab
                description["lab"] = {"accel": lab.accel.get("accel"), "boot_seconds": lab.boot_seconds,
                                      "pcpus": lab.config.pcpus, "dom0_vcpus": lab.dom0_vcpus,
                                      "hypervisor": lab.hypervisor.name if lab.hypervisor else None}
        description["applied"] = self._readback
        if self._ready_at is not None:
            description["boot_seconds"] = round(self._ready_at - self._launched_at, 1)
        return description

    def warnings(self) -> list[str]:
        if _resolve_where(self.config) != "lab":
            return []
        accel = "TCG" if self._dom0 is None or self._dom0.lab is None or \
            self._dom0.lab.accel.get("accel") != "kvm" else "KVM"
        return [LAB_WARNING.format(accel=accel)]

    def close(self) -> None:
        dom0 = self._dom0
        try:
            if dom0 is not None and (dom0.lab is None or dom0.lab.alive()):
                if isinstance(self._relay, baremetal.XenConsoleRelay) and self._domain is not None:
                    baremetal.xen_request_stop(dom0, self._domain, self._relay)  # every sample it holds, then off
                if self._relay is not None:
                    self._relay.stop(grace=2.0)
                if self._domain is not None:
                    if self._powered_off_by_itself():  # xl's monitor of the domain is destroying it
                        self._wait_gone(SELF_DESTROY_WAIT_S)
                    if self.domain_exists():
                        dom0.run(["xl", "destroy", self._domain])
                    dom0.run(["rm", "-rf", f"{RUN_DIR}/{self._domain}"])
                if self._pool is not None:
                    dom0.destroy_pool(self._pool)
        finally:  # a dom0 that stopped answering still gets its shared resources (a lab) closed
            self._relay = self._domain = self._pool = None
            super().close()
