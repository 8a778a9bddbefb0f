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
# main job brings up). With trace.stream (the flight recorder) it goes while the run goes: rtvirt-trace relays
# the instance's trace_pipe (agents/trace/relay.c), and the host keeps only what can explain an outlier
# (explain.guest_stream); a stop file and a pid file let ``end`` stop the relay whether or not it has started
# yet (a domU's relay waits for its route to dom0). Without it, the buffer is sent once, after the main job.
# Either way the stream is: the begin mark, the trace lines, each traced CPU's ring statistics, the end mark.
# The instance is removed at the end.
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
    if [ -e /rtvirt/jobs/trace.stream ]; then
      guest_trace_send guest_trace_relayed "$t" &
      guest_trace_relay=$!
    fi
    return 0
  fi
  [ -d "$t" ] || return 0
  echo 0 > "$t/tracing_on"
  if [ -n "$guest_trace_relay" ]; then
    touch /tmp/rtvirt-trace.stop
    [ -e /tmp/rtvirt-trace.pid ] && kill -TERM "$(cat /tmp/rtvirt-trace.pid)" 2>/dev/null
    wait "$guest_trace_relay"
  else
    guest_trace_send guest_trace_text "$t"
  fi
  echo > "$t/set_event"
  rmdir "$t"
}
guest_trace_send() {
  if [ -e /rtvirt/jobs/trace.dest ]; then
    read -r trace_host trace_port < /rtvirt/jobs/trace.dest
    n=0
    until ip route 2>/dev/null | grep -q "^$trace_host " || [ -e /tmp/rtvirt-trace.stop ] || [ $n -ge 6000 ]; do
      n=$((n+1)); sleep 0.1
    done
    "$@" | nc -w 60 "$trace_host" "$trace_port"
  else
    "$@" > /dev/virtio-ports/rtvirt.trace
  fi
}
guest_trace_relayed() {
  echo "RTVIRT-TRACE-BEGIN"
  /rtvirt/bin/rtvirt-trace "$1" $(cat /rtvirt/jobs/trace.cpus) &
  echo $! > /tmp/rtvirt-trace.pid
  [ -e /tmp/rtvirt-trace.stop ] && kill -TERM $! 2>/dev/null
  wait $!
  guest_trace_stats "$1"
  echo "RTVIRT-TRACE-END"
}
guest_trace_text() {
  echo "RTVIRT-TRACE-BEGIN"
  for c in $(cat /rtvirt/jobs/trace.cpus); do cat "$1/per_cpu/cpu$c/trace"; done
  guest_trace_stats "$1"
  echo "RTVIRT-TRACE-END"
}
guest_trace_stats() {
  for c in $(cat /rtvirt/jobs/trace.cpus); do sed "s/^/RTVIRT-TRACE-STATS cpu$c /" "$1/per_cpu/cpu$c/stats"; done
}
"""
