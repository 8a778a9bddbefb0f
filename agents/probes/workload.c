/* workload: application-level execution time in the MiBench automotive spirit (our own code).
 * Each iteration runs one kernel over the same input and records its duration (value, ns) and
 * cycles (aux). Kernels:
 *   qsort     sort --size bytes of 16-byte records (default 1.2 MB, more than a typical L2) with our
 *             own quicksort; the input comes from a fixed seed and is copied back before every
 *             iteration (the copy is not timed), so every iteration sorts the same data.
 *   basicmath solve a fixed family of cubic equations, take integer square roots of a fixed range and
 *             convert a sweep of angles between degrees and radians.
 *   bitcount  count the bits of a fixed array of 64-bit words by five methods and cross-check them.
 * Our own sort rather than libc qsort: the timing then does not depend on which libc the (static)
 * agent was built with, and the sort never allocates. */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probes.h"

static struct {
    const char *kernel;
    uint64_t size;
} opt = {.kernel = "qsort", .size = 1200000};

static const rtv_opt workload_opts[] = {
    {"kernel", RTV_OPT_STR, &opt.kernel, 0, 0, "qsort, basicmath or bitcount"},
    {"size", RTV_OPT_U64, &opt.size, 1024, 1ull << 32, "qsort data set in bytes"},
    {0},
};

static const char *const kind_names[] = {"qsort", "basicmath", "bitcount", NULL};
enum { KERNEL_QSORT, KERNEL_BASICMATH, KERNEL_BITCOUNT };
static int kernel_index = -1;

static uint64_t xorshift(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* ---- qsort ---- */

typedef struct {
    uint32_t key;
    uint32_t payload[3];
} item;

static void swap_items(item *a, item *b) {
    item t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(item *v, size_t n) {
    for (size_t i = 1; i < n; i++) {
        item x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1].key > x.key; j--) v[j] = v[j - 1];
        v[j] = x;
    }
}

/* Quicksort with median-of-three pivots; recurses into the smaller part, loops on the larger. */
static void quicksort(item *v, size_t n) {
    while (n > 16) {
        size_t mid = n / 2;
        if (v[mid].key < v[0].key) swap_items(&v[mid], &v[0]);
        if (v[n - 1].key < v[0].key) swap_items(&v[n - 1], &v[0]);
        if (v[n - 1].key < v[mid].key) swap_items(&v[n - 1], &v[mid]);
        uint32_t pivot = v[mid].key;
        size_t i = 0, j = n - 1;
        for (;;) {
            while (v[i].key < pivot) i++;
            while (v[j].key > pivot) j--;
            if (i >= j) break;
            swap_items(&v[i++], &v[j--]);
        }
        size_t left = j + 1;
        if (left < n - left) {
            quicksort(v, left);
            v += left;
            n -= left;
        } else {
            quicksort(v + left, n - left);
            n = left;
        }
    }
    insertion_sort(v, n);
}

/* ---- basicmath ---- */

/* Real roots of a x^3 + b x^2 + c x + d (a != 0) by the depressed cubic; returns how many. */
static int solve_cubic(double a, double b, double c, double d, double roots[3]) {
    double p = (3 * a * c - b * b) / (3 * a * a);
    double q = (2 * b * b * b - 9 * a * b * c + 27 * a * a * d) / (27 * a * a * a);
    double shift = -b / (3 * a);
    double disc = q * q / 4 + p * p * p / 27;
    if (disc > 0) {
        double s = sqrt(disc);
        roots[0] = cbrt(-q / 2 + s) + cbrt(-q / 2 - s) + shift;
        return 1;
    }
    if (p == 0) {
        roots[0] = shift;
        return 1;
    }
    double r = 2 * sqrt(-p / 3);
    double angle = acos(3 * q / (p * r)) / 3;
    for (int k = 0; k < 3; k++) roots[k] = r * cos(angle - 2 * M_PI * k / 3) + shift;
    return 3;
}

/* Integer square root by binary digit-by-digit extraction. */
static uint32_t isqrt(uint64_t x) {
    uint64_t result = 0, bit = 1ull << 62;
    while (bit > x) bit >>= 2;
    while (bit) {
        if (x >= result + bit) {
            x -= result + bit;
            result = (result >> 1) + bit;
        } else {
            result >>= 1;
        }
        bit >>= 2;
    }
    return (uint32_t)result;
}

static double basicmath(void) {
    double sink = 0, roots[3];
    for (int a = 1; a <= 4; a++)
        for (int b = -8; b <= 8; b += 2)
            for (int c = -9; c <= 9; c += 3)
                for (int d = -10; d <= 10; d += 4) {
                    int n = solve_cubic(a, b, c, d, roots);
                    for (int k = 0; k < n; k++) sink += roots[k];
                }
    for (uint64_t x = 0; x < 20000; x++) sink += isqrt(x * 104729u + 7);
    for (int centi = 0; centi < 36000; centi++) {
        double radians = (centi / 100.0) * M_PI / 180.0;
        sink += radians * 180.0 / M_PI;
    }
    return sink;
}

/* ---- bitcount ---- */

enum { BITCOUNT_WORDS = 4096 };
static uint8_t byte_bits[256];

static int bits_shift(uint64_t x) {
    int n = 0;
    for (; x; x >>= 1) n += (int)(x & 1);
    return n;
}
static int bits_sparse(uint64_t x) { /* one step per set bit */
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}
static int bits_nibble(uint64_t x) {
    static const uint8_t nibble[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
    int n = 0;
    for (; x; x >>= 4) n += nibble[x & 15];
    return n;
}
static int bits_bytes(uint64_t x) {
    int n = 0;
    for (int i = 0; i < 8; i++, x >>= 8) n += byte_bits[x & 255];
    return n;
}
static int bits_swar(uint64_t x) { /* pairwise sums in parallel within the word */
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
}

static int bitcount(const uint64_t *words) {
    int (*const methods[])(uint64_t) = {bits_shift, bits_sparse, bits_nibble, bits_bytes, bits_swar};
    long totals[5] = {0};
    for (int m = 0; m < 5; m++)
        for (int i = 0; i < BITCOUNT_WORDS; i++) totals[m] += methods[m](words[i]);
    for (int m = 1; m < 5; m++)
        if (totals[m] != totals[0]) return -1;
    return (int)totals[0];
}

/* ---- driver ---- */

typedef struct {
    rtv_ctx *ctx;
    int index;
    int status;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    rtv_ctx *ctx = a->ctx;
    rtv_setup_thread(ctx, a->index, (int)ctx->common.priority);
    size_t count = opt.size / sizeof(item);
    size_t words = kernel_index == KERNEL_QSORT ? count * 4 : BITCOUNT_WORDS * 2;
    uint32_t *input = malloc(words * sizeof(uint32_t)), *scratch = malloc(words * sizeof(uint32_t));
    if (!input || !scratch) rtv_die(RTV_EXIT_FAILURE, "out of memory for the workload data");
    uint64_t seed = 0x9e3779b97f4a7c15ull; /* same data in every thread and every run */
    for (size_t i = 0; i < words; i++) input[i] = (uint32_t)xorshift(&seed);
    const int cpu = sched_getcpu();
    volatile double sink = 0;
    for (uint64_t n = 0; !ctx->common.loops || n < ctx->common.loops; n++) {
        if (rtv_should_stop(ctx)) break;
        memcpy(scratch, input, words * sizeof(uint32_t));
        uint64_t t0 = rtv_cycles();
        switch (kernel_index) {
        case KERNEL_QSORT: quicksort((item *)scratch, count); break;
        case KERNEL_BASICMATH: sink += basicmath(); break;
        case KERNEL_BITCOUNT: {
            int bits = bitcount((const uint64_t *)scratch);
            if (bits < 0) {
                a->status = RTV_EXIT_FAILURE;
                rtv_stop_requested = 1;
                fprintf(stderr, "rtvirt-agent: workload bitcount: the counting methods disagree\n");
            }
            sink += bits;
            break;
        }
        }
        uint64_t t1 = rtv_cycles();
        rtv_sample(ctx, a->index, rtv_cycles_to_mono(ctx, t0), (int64_t)rtv_cycles_to_ns(t1 - t0), t1 - t0, cpu,
                   kernel_index);
        if (n == 0 && kernel_index == KERNEL_QSORT) {
            const item *v = (const item *)scratch;
            for (size_t i = 1; i < count; i++)
                if (v[i - 1].key > v[i].key) {
                    fprintf(stderr, "rtvirt-agent: workload qsort: the output is not sorted\n");
                    a->status = RTV_EXIT_FAILURE;
                    rtv_stop_requested = 1;
                    break;
                }
        }
    }
    free(input);
    free(scratch);
    return NULL;
}

static int workload_validate(rtv_common *common) {
    (void)common;
    for (int i = 0; kind_names[i]; i++)
        if (!strcmp(opt.kernel, kind_names[i])) kernel_index = i;
    if (kernel_index < 0)
        rtv_die(RTV_EXIT_USAGE, "invalid value for '--kernel': '%s' (choose qsort, basicmath or bitcount)", opt.kernel);
    for (int i = 0; i < 256; i++) byte_bits[i] = (uint8_t)bits_swar((uint64_t)i);
    return 0;
}

static int workload_run(rtv_ctx *ctx) {
    worker_arg args[RTV_MAX_THREADS];
    int n = (int)ctx->common.threads;
    for (int i = 0; i < n; i++) args[i] = (worker_arg){ctx, i, 0};
    rtv_run_threads(n, worker, args, sizeof args[0]);
    for (int i = 0; i < n; i++)
        if (args[i].status) return args[i].status;
    return 0;
}

const rtv_probe rtv_probe_workload = {
    .name = "workload",
    .summary = "application-level execution time (qsort, basicmath, bitcount), per iteration",
    .opts = workload_opts,
    .value_field = "duration_ns",
    .aux_field = "cycles",
    .kind_names = kind_names,
    .stat_names = (const char *const[]){NULL},
    .validate = workload_validate,
    .run = workload_run,
};
