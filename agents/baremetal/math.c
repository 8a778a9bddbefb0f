/* The libm functions the workload kernels (agents/common/workload_kernels.h, which declares them) call in
 * the guest, written for basicmath: accurate to a few ulp over its inputs, not a general libm. Built with the
 * floating-point registers (x86 SSE, Arm FP/SIMD) like workload.c: only the workload thread runs them. */
#include "kernel.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

double sqrt(double x);
double cbrt(double x);
double cos(double x);
double acos(double x);

double sqrt(double x) { return __builtin_sqrt(x); } /* one instruction (sqrtsd, fsqrt): built -fno-math-errno */

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
