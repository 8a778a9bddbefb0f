/* workload: the Linux workload probe's kernels (agents/common/workload_kernels.h), timed in the guest.
 * Built with the FP registers (x86 SSE, Arm FP/SIMD), as math.c (the libm functions basicmath calls):
 * basicmath needs doubles. Nothing else in
 * the kernel touches the vector registers (everything else is built -mgeneral-regs-only) and only the
 * workload thread runs this code, so the interrupt stubs need not save them. */
#include "kernel.h"

#include "workload_kernels.h"

static const char *const workload_kinds[] = {"qsort", "basicmath", "bitcount", NULL};
static const char *const workload_stats[] = {NULL};
const probe_desc workload_desc = {"workload", "duration_ns", "cycles", workload_kinds, workload_stats};

int workload_run(void) {
    const uint64_t deadline = run_deadline();
    int kernel = !strcmp(P.kernel, "qsort") ? 0 : !strcmp(P.kernel, "basicmath") ? 1 : 2;
    size_t count = P.size / sizeof(item);
    size_t words = kernel == 0 ? count * 4 : BITCOUNT_WORDS * 2;
    uint32_t *input = arena_alloc(words * sizeof(uint32_t), "size");
    uint32_t *scratch = arena_alloc(words * sizeof(uint32_t), "size");
    for (int i = 0; i < 256; i++) byte_bits[i] = (uint8_t)bits_swar((uint64_t)i);
    uint64_t seed = 0x9e3779b97f4a7c15ull; /* the Linux probe's data */
    for (size_t i = 0; i < words; i++) input[i] = (uint32_t)xorshift(&seed);
    volatile double sink = 0;
    for (uint64_t n = 0; !P.loops || n < P.loops; n++) {
        if (cycles() >= deadline || stop_pending()) break;
        memcpy(scratch, input, words * sizeof(uint32_t));
        uint64_t t0 = cycles();
        switch (kernel) {
        case 0: quicksort((item *)scratch, count); break;
        case 1: sink += basicmath(); break;
        default: {
            int bits = bitcount((const uint64_t *)scratch);
            if (bits < 0) run_error("workload bitcount: the counting methods disagree");
            sink += bits;
        }
        }
        uint64_t t1 = cycles();
        stream_sample(cycles_to_ns(t0), (int64_t)cycles_to_ns(t1 - t0), t1 - t0, 0, (uint16_t)kernel);
        if (n == 0 && kernel == 0) {
            const item *v = (const item *)scratch;
            for (size_t i = 1; i < count; i++)
                if (v[i - 1].key > v[i].key) run_error("workload qsort: the output is not sorted");
        }
        stream_drain(); /* untimed: between iterations */
    }
    return 0;
}
