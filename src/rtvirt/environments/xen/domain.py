"""The xen environment: a domU created paused, put in its cpupool, its settings read back, then unpaused."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InputError, RunError
from ...explain.guest_channel import GUEST_TRACE_FILE
from .. import baremetal
from ..base import Environment, EnvironmentConfig, Launched, SharedResources
from ..guest_image import GUEST_AGENT_DIR, GuestJob, guest_description, guest_image, job_archive
from .arch import XEN_LAB_ARCHES
from .config import XenConfig
from .console import (
    ACK_FIFO,
    CONSOLE_LOG,
    COPY_PORT_BASE,
    STREAM_COPY,
    STREAM_DIR,
    STREAM_PORT_BASE,
    STREAM_SCRIPT,
    TRACE_PORT_BASE,
    TRACE_WAIT_S,
    Dom0Listeners,
    DomUJob,
)
from .dom0 import NAME_PREFIX, RUN_DIR
from .files import DOM0_LINK_ADDRESS
from .lab import reclaim_xen_labs
from .local import is_dom0
from .relays import BaremetalRelay, ListenerRelay
from .teardown import XenTeardown
from .where import _open_dom0, _resolve_where
from .xl import _mode_refusal, _table, _xl_info

if TYPE_CHECKING:
    from ...explain.config import ExplainConfig
    from ...explain.model import TraceSource

LAB_WARNING = ("nested Xen under {accel} (a Xen lab in QEMU on this machine; emulated: {emulated}): its timings "
               "are not representative of a Xen host")


class XenEnvironment(XenTeardown):
    kind = "xen"

    config_model = XenConfig

    on_host = False
    setup_part = "xen"

    config: XenConfig

    @staticmethod
    def available() -> str | None:
        if is_dom0():
            return None
        from ..qemu import QEMU

        for tool, package in ((QEMU, "qemu-system-x86"), ("/usr/lib/xen-4.17/bin/xl", "xen-utils-4.17"),
                              ("/usr/sbin/sshd", "openssh-server"), ("ssh-keygen", "openssh-client")):
            if not (Path(tool).exists() if tool.startswith("/") else shutil.which(tool)):
                return f"the Xen lab needs {tool} (apt-get install {package}; scripts/setup.sh does)"
        return None

    @classmethod
    def reclaim(cls, config: EnvironmentConfig, shared: SharedResources) -> list[str]:
        assert isinstance(config, XenConfig)
        if _resolve_where(config) == "lab":
            return reclaim_xen_labs()  # a lab's domains and pools died with its QEMU
        return _open_dom0(config, shared).reclaim()

    def platform_lost(self, failure: str) -> str | None:
        lab = self._dom0.lab if self._dom0 is not None else None
        return lab.lost(failure, self.workdir) if lab is not None else None

    def start(self) -> None:
        if self._dom0 is not None:
            return
        dom0 = self._parent._dom0 if self._parent is not None else _open_dom0(self.config, self.shared)
        assert dom0 is not None
        self._dom0 = dom0
        if dom0.lab is not None and not dom0.lab.alive():
            raise RunError(f"the Xen lab stopped: {dom0.lab.why_stopped()}")
        self._index = dom0.next_index()
        if self._parent is None:
            refusal = _mode_refusal(self._domain_type(), dom0.info())
            if refusal is not None:
                raise InputError(f"environment {self.config.label!r}: {refusal}")
        if self._parent is None and self.config.scheduler != "default":
            self._make_pool()

    def _domain_config(self, name: str, initrd: str | None, ip: str | None, boot: list[str] | None = None) -> str:
        """xl's configuration of the domU; ``boot`` replaces the lines that boot our Linux image."""
        assert self._dom0 is not None
        if boot is None:
            kernel = self._dom0.domu_files(self._flavour(), self._domain_type())[0]
            boot = [f'type = "{self._domain_type()}"', f'kernel = "{kernel}"', f'ramdisk = "{initrd}"',
                    # warnings and worse on the console (kept in the run): a domU that hangs or panics says where
                    # (quiet hid the soft lockup's backtrace of a disturbing domU stuck in its boot)
                    'extra = "console=hvc0 rdinit=/init loglevel=5"',
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
        if self._parent is None:
            self._stream_out = out
        if self.config.guest == "baremetal" and self._parent is None:
            return self._launch_baremetal(agent, args, out, name, directory)
        argv = [f"{GUEST_AGENT_DIR}/{agent}", *args]
        ip = None
        trace_files = self._guest_trace_files if out is not None and self._parent is None else None
        if out is not None:
            if self._index > 250:
                raise RunError("xen: more than 250 measuring domUs in one campaign")
            ip = f"10.213.0.{self._index + 1}"
            port = STREAM_PORT_BASE + self._index
            copy_port = COPY_PORT_BASE + self._index
            argv = ["/bin/sh", "-c", STREAM_SCRIPT, "rtvirt-stream", DOM0_LINK_ADDRESS, ip, str(port), str(copy_port),
                    STREAM_DIR, *argv, "--out=-", f"--confirm={ACK_FIFO}", f"--tee={STREAM_COPY}"]
            if trace_files is not None:  # the guest's trace goes out over the vif the stream script brought up
                trace_files = {**trace_files, "trace.dest": f"{DOM0_LINK_ADDRESS} {TRACE_PORT_BASE + self._index}\n"
                               .encode()}
        local_jobs = self.workdir / "jobs.cpio"
        local_jobs.write_bytes(job_archive(GuestJob(argv), self._beside, (), trace_files))
        local_config = self.workdir / "domain.cfg"
        dom0.run(["mkdir", "-p", directory]).check("xen: dom0 mkdir")
        self._domain = name  # from here on, close() destroys it
        dom0.transport.put(local_jobs, f"{directory}/jobs.cpio")
        if self._parent is None:
            self._image = guest_image(self._flavour(), self.config.arch)  # what the manifest says of it
        dom0.run(["sh", "-c", 'cat "$1" "$2" > "$3"', "sh", dom0.domu_files(self._flavour(), self._domain_type())[1],
                  f"{directory}/jobs.cpio",
                  f"{directory}/initrd"]).check("xen: assembling the domU initramfs")
        if self._domain_type() == "hvm":
            dom0.hvm_support()
        local_config.write_text(self._domain_config(name, f"{directory}/initrd", ip))
        dom0.transport.put(local_config, f"{directory}/domain.cfg")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            trace_port = TRACE_PORT_BASE + self._index

            listeners = Dom0Listeners(dom0.transport, directory)
            self._relay = ListenerRelay(listeners.listen(port, out),
                                        listeners.listen(copy_port, self.workdir / "stream-copy.rtvs"),
                                        self.workdir / "stream-copy.rtvs",
                                        listeners.listen(trace_port, self.workdir / GUEST_TRACE_FILE)
                                        if trace_files is not None else None, listeners.end)
            self._wait_listening(port)
            self._wait_listening(copy_port)
            if trace_files is not None:
                self._wait_listening(trace_port)
        self._launched_at = time.monotonic()
        dom0.xl("create", "-p", f"{directory}/domain.cfg", what=f"create {name}")
        self._apply_scheduling(name)
        self._read_back(name)
        dom0.xl("unpause", name)
        self._process = DomUJob(self, self._relay)
        return Launched(self._process, out, confirm=self._confirm_delivery if out is not None else None)

    def _confirm_delivery(self, records: int) -> str:
        """Tell the domU's agent, back through dom0's listener and the same connection, how many data records
        the host holds (the domU powers off once its agent is told)."""
        assert self._relay is not None
        try:
            self._relay.send(f"RTVIRT-ACK {int(records)}\n".encode())
        except (OSError, RunError) as exc:
            return f"not sent: {str(exc)[:200]}"
        return "sent"

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
        dom0.transport.put(baremetal.kernel_path(self.config.arch), f"{directory}/kernel")
        local_config = self.workdir / "domain.cfg"
        local_config.write_text(self._domain_config(name, None, None, baremetal.xen_domain_lines(
            f"{directory}/kernel", line, memory, self.config.arch)))
        dom0.transport.put(local_config, f"{directory}/domain.cfg")
        log = CONSOLE_LOG.format(name=name)
        dom0.run(["rm", "-f", log]).check("xen: removing an old console log")  # a reused name's log is appended
        self._launched_at = time.monotonic()
        dom0.xl("create", "-p", f"{directory}/domain.cfg", what=f"create {name}")
        self._relay = BaremetalRelay(baremetal.XenConsoleRelay(dom0.transport, log, name, self.workdir / "console.raw",
                                                               out))
        self._apply_scheduling(name)
        self._read_back(name)
        dom0.xl("unpause", name)
        self._process = DomUJob(self, self._relay)
        return Launched(self._process, out)

    def add_guest_job(self, agent: str, args: list[str]) -> None:
        if self._process is not None:  # the jobs are in the initramfs: they cannot join a running domU
            raise RunError(f"{self.config.label}: a stressor inside the domU starts with it: give its disturbance "
                           "start_order = ['stress-first'] and no events")
        self._beside.append(GuestJob([f"{GUEST_AGENT_DIR}/{agent}", *args]))

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        """Another domU of the same Xen; its pCPUs come from ``stressor_cpus``, else from its disturbance's
        placement (``host_cpus``: Xen pCPUs, guest_placement), else the measuring domU's."""
        config = self.config.model_copy(update={"name": f"{self.config.label[:40]}-stress{index}"})
        domu = XenEnvironment(config, self.supervisor, self.workdir / f"stress-vm-{index}", self.shared)
        domu._parent = self
        domu._placed = host_cpus  # None unless a guest_cpus placed it (Xen's measured_cpus are all host CPUs)
        return domu

    def trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        """The Xen layer (explain.xen): xentrace in this domU's dom0 beside the run; the guest layer
        (explain.guest): a Linux domU traces its measuring vCPU itself and sends the trace to dom0's listener
        after its main job, the bare-metal guest reads its stolen time per sample and times its timer IRQ;
        disturbing domUs add none."""
        from ...explain.guest import guest_layer
        from ...explain.sources import xen_source
        from ...explain.xen import XenDom0, XenDomains

        if self._parent is not None:
            return []
        guest, self._guest_trace_files = guest_layer(self.config.guest, config, self.workdir, self.config.memory,
                                                     self.config.vcpus, lambda: self._stream_out,
                                                     self._guest_trace_received)
        if "xen" not in config.layers:
            return guest

        def open_dom0() -> XenDom0:
            self.start()
            assert self._dom0 is not None
            return XenDom0(self._dom0.transport, self._dom0.cpu_khz(), len(self._pcpus()))

        def domains() -> XenDomains:
            rtds = self.config.rtds
            scheduler = self.config.scheduler if self.config.scheduler != "default" else self._default_scheduler()
            return XenDomains(self._measuring_domid, dict(self._domids), scheduler,
                              {"period_ns": rtds.period, "budget_ns": rtds.budget} if rtds is not None else {},
                              self._stream_out)

        return [xen_source(open_dom0, domains, self.workdir / "explain-xen", config), *guest]

    def _guest_trace_received(self) -> None:
        """Before the domU's relay is stopped: a domU that said its job ended has sent its trace (it does so
        first); wait, bounded, for dom0's listener to hand the last of it over."""
        relay = self._relay
        if isinstance(relay, ListenerRelay) and self._domain is not None and self.exit_status() is not None:
            relay.trace_received(TRACE_WAIT_S)

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
                description["lab"] = {"arch": lab.arch.name,
                                      "emulated": lab.arch.emulated(lab.accel.get("accel", "tcg")),
                                      "accel": lab.accel.get("accel"), "boot_seconds": lab.boot_seconds,
                                      "pcpus": lab.config.pcpus, "dom0_vcpus": lab.dom0_vcpus,
                                      "hypervisor": lab.hypervisor.name if lab.hypervisor else None,
                                      "dom0_root": lab.dom0_root.name if lab.dom0_root else None,
                                      **lab.boot_record()}
        description["applied"] = self._readback
        if self._parent is None:
            description["disturbing_domus"] = self._disturbers
        if self._dom0 is not None:
            description["dom0_slow_answers"] = self._dom0.slow_answers  # status reads retried (patient_run)
        if self._ready_at is not None:
            description["boot_seconds"] = round(self._ready_at - self._launched_at, 1)
        return description

    def warnings(self) -> list[str]:
        if _resolve_where(self.config) != "lab":
            return []
        lab = self._dom0.lab if self._dom0 is not None else None
        accel = "kvm" if lab is not None and lab.accel.get("accel") == "kvm" else "tcg"
        emulated = (lab.arch if lab is not None else XEN_LAB_ARCHES[self.config.arch]).emulated(accel)
        return [LAB_WARNING.format(accel=accel.upper(), emulated=emulated)]
