/* Stressor programs of the bare-metal guest: what the guest-isolation study's disturbing guests do, with
 * no OS in the way and a boot of about a second under TCG (a Linux stressor guest takes tens of seconds).
 *
 *   cpu    spins forever (the study's guest spinning at top priority: here nothing else runs at all), or with
 *          --slice/--period a duty cycle: busy the slice at the start of every period, halted the rest (a known
 *          interferer for the hypervisor to schedule around: the vCPU blocks, its hypervisor runs others)
 *   cache  stores over 1.5 x a cache level's size forever (the study's memset of 1.5 x L2), the size from
 *          the CPU (x86: CPUID leaf 4, else AMD's 0x80000006; Arm: CLIDR/CCSIDR) or --buffer
 *
 * They take the Linux stressor agent's argv for these two (rtvirt.environments.baremetal drops --workers=1,
 * which only means something with several). Both run until the host stops the guest
 * (an NMI: stop_now writes the stream out and ends it, reason 'signal'), or until --duration if one is given.
 * Their stream carries only statistics (nothing is timed): what was found at the start, and the work done so far,
 * rewritten as it grows (the last value counts), so the host can tell the stressor really ran. */
#include "kernel.h"

uint64_t stress_level, stress_buffer;       /* --level, --buffer (options of "cache", main.c) */
uint64_t stress_slice_ns, stress_period_ns; /* --slice, --period (options of "cpu"): 0 is always busy */

static const char *const no_kinds[] = {NULL};
static const char *const cpu_stats[] = {"spins_per_ms", "spins", NULL};
static const char *const cache_stats[] = {"cache_level", "cache_bytes", "buffer_bytes", "passes", NULL};
const probe_desc stress_cpu_desc = {"cpu", "none", NULL, no_kinds, cpu_stats};
const probe_desc stress_cache_desc = {"cache", "none", NULL, no_kinds, cache_stats};

static bool until_deadline(uint64_t deadline) { return !stop_pending() && cycles() < deadline; }

/* Interrupts stay on: the host's stop (x86: an NMI, then an ordinary interrupt; Arm: an interrupt) must reach
 * the loop. spins: loop
 * iterations done (they grow only while the vCPU runs; spins_per_ms is the first millisecond's rate). */
int stress_cpu_run(void) {
    const uint64_t deadline = run_deadline(), ms = ns_to_cycles(1000000);
    uint64_t start = cycles(), per_ms = 0, spins = 0;
    /* one calibration millisecond of the same loop (a counter read, two compares): what a spin costs here */
    for (uint64_t now = start; now - start < ms && !stop_pending(); now = cycles()) per_ms++;
    stream_stat(0, 0, (int64_t)per_ms);
    uint64_t report = cycles() + 100 * ms; /* every 100 ms */
    const uint64_t slice = ns_to_cycles(stress_slice_ns), period = ns_to_cycles(stress_period_ns);
    uint64_t busy_until = period ? cycles() + slice : UINT64_MAX, next_period = busy_until - slice + period;
    for (uint64_t now = cycles(); now < deadline && !stop_pending(); now = cycles()) {
        spins++;
        if (now >= report) {
            stream_stat(0, 1, (int64_t)spins);
            stream_drain();
            report = cycles() + 100 * ms;
        }
        if (now >= busy_until) { /* duty cycle: halted until the next period's start (missed ones skipped) */
            while (next_period <= now) next_period += period;
            sleep_until(next_period);
            busy_until = next_period + slice;
            next_period += period;
        }
    }
    return 0;
}

int stress_cache_run(void) {
    const uint64_t deadline = run_deadline();
    uint64_t level = 0, size = cache_bytes(stress_level, &level);
    uint64_t bytes = stress_buffer ? stress_buffer : size + size / 2;
    if (!bytes) usage_error("buffer", "the CPU tells no size for that cache level here: give the buffer size");
    bytes = (bytes + 7) & ~7ull;
    volatile uint64_t *buffer = arena_alloc(bytes, "buffer");
    stream_stat(0, 0, (int64_t)level);
    stream_stat(0, 1, (int64_t)size);
    stream_stat(0, 2, (int64_t)bytes);
    stream_drain();
    /* 8-byte stores, whole passes; the deadline and the stop flag are looked at every 64 KiB */
    for (uint64_t pass = 1; until_deadline(deadline); pass++) {
        for (uint64_t i = 0; i < bytes / 8 && until_deadline(deadline); i += 8192)
            for (uint64_t j = i; j < i + 8192 && j < bytes / 8; j++) buffer[j] = pass;
        stream_stat(0, 3, (int64_t)pass);
        if (stream_pending() >= 4096) stream_drain();
    }
    return 0;
}
