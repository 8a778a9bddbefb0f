/* Stressor programs of the bare-metal guest: what the guest-isolation study's disturbing guests do, with
 * no OS in the way and a boot of about a second under TCG (a Linux stressor guest takes tens of seconds).
 *
 *   cpu    spins forever (the study's guest spinning at top priority: here nothing else runs at all)
 *   cache  stores over 1.5 x a cache level's size forever (the study's memset of 1.5 x L2), the size from
 *          CPUID (leaf 4, else AMD's 0x80000006) or --buffer
 *
 * They take the Linux stressor agent's argv for these two (rtvirt.environments.baremetal drops the options
 * that only mean something with several workers or a duty cycle). Both run until the host stops the guest
 * (an NMI: stop_now writes the stream out and ends it, reason 'signal'), or until --duration if one is given.
 * Their stream carries only statistics (nothing is timed): what was found at the start, and the work done so far,
 * rewritten as it grows (the last value counts), so the host can tell the stressor really ran. */
#include "kernel.h"

uint64_t stress_level, stress_buffer; /* --level, --buffer (options of "cache", main.c) */

static const char *const no_kinds[] = {NULL};
static const char *const cpu_stats[] = {"spins_per_ms", "spins", NULL};
static const char *const cache_stats[] = {"cache_level", "cache_bytes", "buffer_bytes", "passes", NULL};
const probe_desc stress_cpu_desc = {"cpu", "none", NULL, no_kinds, cpu_stats};
const probe_desc stress_cache_desc = {"cache", "none", NULL, no_kinds, cache_stats};

static bool until_deadline(uint64_t deadline) { return !stop_requested && rdtsc() < deadline; }

/* Interrupts stay on: the host's stop (NMI, then an ordinary interrupt) must reach the loop. spins: loop
 * iterations done (they grow only while the vCPU runs; spins_per_ms is the first millisecond's rate). */
int stress_cpu_run(void) {
    const uint64_t deadline = run_deadline_tsc(), ms = ns_to_tsc(1000000);
    uint64_t start = rdtsc(), per_ms = 0, spins = 0;
    /* one calibration millisecond of the same loop (a TSC read, two compares): what a spin costs here */
    for (uint64_t now = start; now - start < ms && !stop_requested; now = rdtsc()) per_ms++;
    stream_stat(0, 0, (int64_t)per_ms);
    uint64_t report = rdtsc() + 100 * ms; /* every 100 ms */
    for (uint64_t now = rdtsc(); now < deadline && !stop_requested; now = rdtsc()) {
        spins++;
        if (now >= report) {
            stream_stat(0, 1, (int64_t)spins);
            stream_drain();
            report = rdtsc() + 100 * ms;
        }
    }
    return 0;
}

/* The data or unified cache of `level` (0: the highest level there is); bytes, 0 if CPUID does not say. */
static uint64_t cache_bytes(uint64_t level, uint64_t *found_level) {
    uint32_t r[4];
    uint64_t best = 0;
    *found_level = 0;
    cpuid(0, 0, r);
    if (r[0] >= 4) {
        for (uint32_t sub = 0; sub < 16; sub++) {
            cpuid(4, sub, r);
            uint32_t type = r[0] & 0x1f, this_level = (r[0] >> 5) & 7;
            if (type == 0) break;
            if (type == 2 || (level ? this_level != level : this_level <= *found_level)) continue;
            uint64_t ways = (r[1] >> 22) + 1, parts = ((r[1] >> 12) & 0x3ff) + 1, line = (r[1] & 0xfff) + 1;
            best = ways * parts * line * ((uint64_t)r[2] + 1);
            *found_level = this_level;
        }
    }
    if (best) return best;
    cpuid(0x80000000u, 0, r);
    if (r[0] >= 0x80000006u) { /* AMD: L2 in KiB, L3 in 512 KiB units */
        cpuid(0x80000006u, 0, r);
        uint64_t l2 = (uint64_t)(r[2] >> 16) << 10, l3 = (uint64_t)(r[3] >> 18) << 19;
        if ((level == 3 || level == 0) && l3) {
            *found_level = 3;
            return l3;
        }
        if ((level == 2 || level == 0) && l2) {
            *found_level = 2;
            return l2;
        }
    }
    return 0;
}

int stress_cache_run(void) {
    const uint64_t deadline = run_deadline_tsc();
    uint64_t level = 0, size = cache_bytes(stress_level, &level);
    uint64_t bytes = stress_buffer ? stress_buffer : size + size / 2;
    if (!bytes) usage_error("buffer", "CPUID tells no size for that cache level here: give the buffer size");
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
