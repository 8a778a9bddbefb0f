"""cpupools and scheduler parameters of a domU: the pool made for a scenario, RTDS reservations, credit
weights, ARINC 653 schedules, and every setting read back from ``xl`` into the manifest."""

from __future__ import annotations

import re
from typing import Any

from ...errors import RunError
from .config import DEFAULT_A653, RtdsParams, _us
from .dom0 import DEFAULT_POOL, NAME_PREFIX
from .state import XenDomainState
from .xl import _table, _vcpu_list

# cpupool ids by name, as "ID NAME" lines (libxl keeps them in xenstore; xl prints names only)
POOL_IDS_SCRIPT = ('for i in $(seq 0 63); do n=$(xenstore-read /local/pool/$i/name 2>/dev/null) && echo "$i $n"; '
                   'done; exit 0')


class XenPools(XenDomainState):
    """A domU's cpupool and scheduling parameters (the measuring domU owns the pool; disturbers share it)."""

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
        stressor_cpus = (self.config.stressor_cpus or self._placed) if self.config.pin else None
        if stressor_cpus is None or set(stressor_cpus) <= set(parent._pool_cpus):
            return parent._pool
        return None

    def _apply_scheduling(self, name: str) -> None:
        assert self._dom0 is not None
        if self.config.scheduler == "arinc653" and self._domain_pool() is not None:
            uuid, pool_id = self._identity(name)
            vcpus = 1 if self._parent else self.config.vcpus
            (self._parent or self).add_a653_windows(name, pool_id, [(uuid, vcpu) for vcpu in range(vcpus)])
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

    def add_a653_windows(self, domain: str, pool_id: int, vcpus: list[tuple[str, int]]) -> None:
        """As the pool's owner: give ``domain``'s (UUID, vCPU) windows in the ARINC 653 schedule and set it."""
        self._pool_id = pool_id
        self._a653_domains[domain] = vcpus
        self._set_a653()

    def a653_readback(self) -> dict[str, Any]:
        """As the pool's owner: the ARINC 653 schedule Xen reports, which must be the one set."""
        assert self._dom0 is not None
        shown = self._dom0.run([self._dom0.a653_command(), str(self._pool_id)]).check(
            "xen: reading the ARINC 653 schedule")
        lines = shown.stdout.split("\n")
        frame = int(lines[0].split()[1])
        windows = [{"uuid": f[0], "vcpu": int(f[1]), "runtime_ns": int(f[2])}
                   for f in (line.split() for line in lines[1:]) if len(f) == 3]
        requested = [{"uuid": u, "vcpu": v, "runtime_ns": r} for u, v, r in self._a653_schedule()]
        if windows != requested:
            raise RunError(f"xen: the ARINC 653 schedule Xen reports ({len(windows)} windows) is not the one "
                           "set")
        return {"major_frame_ns": frame, "windows": windows}

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
        domid = self._dom0.xl("domid", name).strip()
        if domid.isdigit():  # the Xen trace names domains by id (explain.xen)
            (self._parent or self)._domids[int(domid)] = name
            if self._parent is None:
                self._measuring_domid = int(domid)
        readback: dict[str, Any] = {"domain": name, "type": self._type_of(domid),
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
            readback["arinc653"] = (self._parent or self).a653_readback()
        self._readback = readback
        if self._parent is not None:  # the measuring domU's manifest says where its disturbers ran
            self._parent._disturbers.append(readback)

    def _type_of(self, domid: str) -> str | None:
        """pv, pvh or hvm as libxl recorded it in xenstore (xl prints no domain type)."""
        assert self._dom0 is not None
        found = self._dom0.run(["xenstore-read", f"/libxl/{domid}/type"]) if domid.isdigit() else None
        return found.stdout.strip()[:16] if found is not None and found.returncode == 0 else None

    def _default_scheduler(self) -> str:
        assert self._dom0 is not None
        match = re.search(r"^xen_scheduler\s*:\s*(\S+)", self._dom0.info(), re.M)
        return match.group(1) if match else "unknown"
