"""The guest's side of the guest layer (explain.guest): the shell its /init runs to trace itself, the port and
file its trace comes through, the marks that frame it. Kept apart from the host's parser, which needs numpy:
what builds a guest image or starts a VM imports only this."""

from __future__ import annotations

__all__ = ["BEGIN_MARK", "END_MARK", "GUEST_TRACE_FILE", "GUEST_TRACE_PORT", "GUEST_TRACE_SHELL", "STATS_MARK"]

GUEST_TRACE_PORT = "rtvirt.trace"
GUEST_TRACE_FILE = "guest-trace.txt"  # in the run's work directory: what the guest sent
BEGIN_MARK, END_MARK, STATS_MARK = "RTVIRT-TRACE-BEGIN", "RTVIRT-TRACE-END", "RTVIRT-TRACE-STATS"

# /init's part (sourced into its script): ``guest_trace start`` before the jobs, ``guest_trace end`` after the
# main job. It only acts when the run's job archive holds trace.* files (an explained run), and only reads
# values rtvirt wrote itself (event names, a hex CPU mask, numbers, an address). The trace goes to the
# rtvirt.trace port, or where trace.dest says (a Xen domU: dom0's address and a port, over its vif, which the
# main job brought up). The instance is removed at the end.
GUEST_TRACE_SHELL = r"""
guest_trace() {
  [ -e /rtvirt/jobs/trace.events ] || return 0
  t=/sys/kernel/tracing/instances/rtvirt-guest
  if [ "$1" = start ]; then
    [ -e /sys/kernel/tracing/instances ] || mount -t tracefs nodev /sys/kernel/tracing
    mkdir "$t" || { echo "rtvirt: no tracefs instance in the guest"; return 0; }
    echo mono > "$t/trace_clock"
    cat /rtvirt/jobs/trace.buffer_kb > "$t/buffer_size_kb"
    cat /rtvirt/jobs/trace.cpumask > "$t/tracing_cpumask"
    cat /rtvirt/jobs/trace.overwrite > "$t/options/overwrite"
    echo 1 > "$t/options/record-tgid"
    for e in $(cat /rtvirt/jobs/trace.events); do echo "$e" >> "$t/set_event" 2>/dev/null; done
    echo 1 > "$t/tracing_on"
    return 0
  fi
  [ -d "$t" ] || return 0
  echo 0 > "$t/tracing_on"
  if [ -e /rtvirt/jobs/trace.dest ]; then
    read -r trace_host trace_port < /rtvirt/jobs/trace.dest
    guest_trace_text "$t" | nc -w 60 "$trace_host" "$trace_port"
  else
    guest_trace_text "$t" > /dev/virtio-ports/rtvirt.trace
  fi
  echo > "$t/set_event"
  rmdir "$t"
}
guest_trace_text() {
  echo "RTVIRT-TRACE-BEGIN"
  for c in $(cat /rtvirt/jobs/trace.cpus); do
    cat "$1/per_cpu/cpu$c/trace"
    sed "s/^/RTVIRT-TRACE-STATS cpu$c /" "$1/per_cpu/cpu$c/stats"
  done
  echo "RTVIRT-TRACE-END"
}
"""
