/* The kernel's clock: the architecture's cycle counter (x86's TSC, Arm's virtual counter CNTVCT) and its rate,
 * found at boot (clock_init), converted to ns with 32.32 fixed-point ratios. */
#include "kernel.h"

uint64_t cycles_hz;
const char *cycles_source = "none";
static uint64_t ns_per_cycle_q32, cycles_per_ns_q32;

static uint64_t q32_ratio(uint64_t num, uint64_t den) { return (uint64_t)(((__uint128_t)num << 32) / den); }
static uint64_t q32_mul(uint64_t v, uint64_t q) { return (uint64_t)(((__uint128_t)v * q) >> 32); }

void clock_init(uint64_t hz, const char *source) {
    cycles_hz = hz;
    cycles_source = source;
    ns_per_cycle_q32 = q32_ratio(1000000000ull, hz);
    cycles_per_ns_q32 = q32_ratio(hz, 1000000000ull);
}

uint64_t cycles_to_ns(uint64_t n) { return q32_mul(n, ns_per_cycle_q32); }
uint64_t ns_to_cycles(uint64_t ns) { return q32_mul(ns, cycles_per_ns_q32); }
uint64_t now_ns(void) { return cycles_to_ns(cycles()); }
