/* The workload kernels (qsort, basicmath, bitcount) shared by the Linux workload probe
 * (agents/probes/workload.c) and the bare-metal guest's (agents/baremetal/workload.c), so both time
 * the same code. Header-only (static functions): the includer provides <stdint.h> and <stddef.h>; the four
 * libm functions basicmath calls are declared here and linked from libm on Linux, from
 * agents/baremetal/math.c in the guest. */
#ifndef RTV_WORKLOAD_KERNELS_H
#define RTV_WORKLOAD_KERNELS_H

double sqrt(double x);
double cbrt(double x);
double cos(double x);
double acos(double x);

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

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

#endif
