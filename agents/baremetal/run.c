/* The run's parameters (main.c parses them from the command line), its deadline and the memory above the
 * image that probes take their data from: what every probe reads, below the boot code that fills it in. */
#include "kernel.h"

params P = {.duration_ns = 10000000000ull, .threads = 1, .priority = 99, .interval_ns = 1000000,
            .distance_ns = 500000, .threshold_ns = 1000, .work_unit = 20000, .iterations = 1000,
            .alloc_size = 256, .report_interval_ns = 5000000000ull, .size = 1200000, .kernel = "qsort",
            .engine = "cyclictest", .confirm = "", .confirm_timeout_ns = 30000000000ull};
static uint64_t start_tsc;

void run_started(void) { start_tsc = cycles(); }

uint64_t run_deadline(void) { return P.duration_ns ? start_tsc + ns_to_cycles(P.duration_ns) : UINT64_MAX; }

extern uint8_t __bss_end[];
static uint64_t arena_next, memory_top;

void arena_init(uint64_t top) { memory_top = top; }

void *arena_alloc(size_t bytes, const char *option) {
    if (!arena_next) arena_next = ((uint64_t)(uintptr_t)__bss_end + 4095) & ~4095ull;
    if (memory_top < arena_next || bytes > memory_top - arena_next) {
        text t = {(char[160]){0}, 0, 160};
        text_str(&t, "needs ");
        text_u64(&t, (bytes >> 20) + 1);
        text_str(&t, " MiB of guest memory, the guest has ");
        text_u64(&t, memory_top > arena_next ? (memory_top - arena_next) >> 20 : 0);
        text_str(&t, " MiB free (give the VM more memory)");
        usage_error(option, t.buf);
    }
    void *p = (void *)(uintptr_t)arena_next;
    arena_next += (bytes + 63) & ~(size_t)63;
    return p;
}

