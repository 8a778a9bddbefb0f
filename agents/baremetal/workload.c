/* workload: the Linux workload probe's kernels (agents/common/workload_kernels.h), timed in the guest.
 * The only file built with SSE: basicmath needs doubles. Nothing else in the kernel touches the
 * vector registers (everything else is built -mgeneral-regs-only) and only the workload thread runs
 * this code, so the interrupt stubs need not save them. The few libm functions basicmath calls are
 * here, written for it (accurate to a few ulp over its inputs, not a general libm). */
#include "kernel.h"

double sqrt(double x);
double cbrt(double x);
double cos(double x);
double acos(double x);

double sqrt(double x) {
    __asm__("sqrtsd %1, %0" : "=x"(x) : "x"(x));
    return x;
}

double cbrt(double x) {
    if (x == 0) return 0;
    double a = x < 0 ? -x : x, y = a > 1 ? a / 3 : 1;
    for (int i = 0; i < 100; i++) { /* Newton: y -= (y^3 - a) / 3y^2 */
        double next = y - (y * y * y - a) / (3 * y * y);
        if (next == y) break;
        y = next;
    }
    return x < 0 ? -y : y;
}

#include "workload_kernels.h"

double cos(double x) {
    const double two_pi = 2 * M_PI;
    x -= two_pi * (double)(int64_t)(x / two_pi);
    if (x > M_PI) x -= two_pi;
    if (x < -M_PI) x += two_pi;
    double term = 1, sum = 1, x2 = x * x;
    for (int k = 1; k < 20; k++) {
        term *= -x2 / ((2 * k - 1) * (2 * k));
        sum += term;
    }
    return sum;
}

static double atan_small(double x) { /* |x| <= tan(pi/8): the series converges fast */
    double term = x, sum = x, x2 = x * x;
    for (int k = 1; k < 30; k++) {
        term *= -x2;
        sum += term / (2 * k + 1);
    }
    return sum;
}

static double atan_pos(double x) { /* x >= 0 */
    if (x > 1) return M_PI / 2 - atan_pos(1 / x);
    if (x > 0.41421356237309503) return M_PI / 4 + atan_small((x - 1) / (x + 1));
    return atan_small(x);
}

double acos(double x) {
    if (x <= -1) return M_PI;
    if (x >= 1) return 0;
    return 2 * atan_pos(sqrt((1 - x) / (1 + x)));
}

static const char *const workload_kinds[] = {"qsort", "basicmath", "bitcount", NULL};
static const char *const workload_stats[] = {NULL};
const probe_desc workload_desc = {"workload", "duration_ns", "cycles", workload_kinds, workload_stats};

int workload_run(void) {
    const uint64_t deadline = run_deadline_tsc();
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
        if (rdtsc() >= deadline) break;
        memcpy(scratch, input, words * sizeof(uint32_t));
        uint64_t t0 = rdtsc();
        switch (kernel) {
        case 0: quicksort((item *)scratch, count); break;
        case 1: sink += basicmath(); break;
        default: {
            int bits = bitcount((const uint64_t *)scratch);
            if (bits < 0) run_error("workload bitcount: the counting methods disagree");
            sink += bits;
        }
        }
        uint64_t t1 = rdtsc();
        stream_sample(tsc_to_ns(t0), (int64_t)tsc_to_ns(t1 - t0), t1 - t0, 0, (uint16_t)kernel);
        if (n == 0 && kernel == 0) {
            const item *v = (const item *)scratch;
            for (size_t i = 1; i < count; i++)
                if (v[i - 1].key > v[i].key) run_error("workload qsort: the output is not sorted");
        }
        stream_drain(); /* untimed: between iterations */
    }
    return 0;
}
