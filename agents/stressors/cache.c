/* cache: memset a buffer of 1.5 x a cache's size, again and again (the cache-pollution guest of the
 * guest-isolation study). Each pass evicts everything else from that cache level; on the last
 * level, which the cores share, neighbours on other cores lose their cached data too.
 *
 * The size comes from sysfs (/sys/devices/system/cpu/cpuN/cache/index*), N being the first CPU of
 * --cpus (else 0). Where sysfs has no cache information (some VMs), glibc's sysconf (CPUID) is the
 * fallback, announced on stderr and in the summary; with neither, --buffer must be given. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stressors.h"

static struct {
    uint64_t level;
    uint64_t buffer;
} opt;

static const rtv_opt cache_opts[] = {
    {"level", RTV_OPT_U64, &opt.level, 0, 4, "cache level to overflow, 0 = the last level"},
    {"buffer", RTV_OPT_U64, &opt.buffer, 0, UINT64_C(1) << 40, "buffer bytes per worker, 0 = 1.5 x that cache"},
    {0},
};

static struct {
    int level;
    char type[32];
    uint64_t size;
    const char *source; /* "sysfs", "sysconf" or "none" */
    char where[96];
    uint64_t buffer;
} found = {.source = "none"};

/* Passes are written in chunks: cheap to interrupt, and small enough that glibc's memset keeps to
 * ordinary stores (for very large sizes it switches to non-temporal ones, which bypass the cache). */
enum { CHUNK = 256 * 1024 };

static bool read_line(const char *path, char *out, size_t cap) {
    FILE *f = fopen(path, "re");
    if (!f) return false;
    bool ok = fgets(out, (int)cap, f) != NULL;
    fclose(f);
    if (ok) out[strcspn(out, "\n")] = 0;
    return ok;
}

static uint64_t parse_size(const char *text) {
    char *end;
    uint64_t v = strtoull(text, &end, 10);
    switch (*end) {
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    default: return v;
    }
}

/* The data or unified cache of `level` (0: the highest level) seen by `cpu`, from sysfs. */
static bool from_sysfs(int cpu, int level) {
    bool any = false;
    for (int index = 0; index < 16; index++) {
        char path[128], text[64], type[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/level", cpu, index);
        if (!read_line(path, text, sizeof text)) continue;
        int this_level = atoi(text);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/type", cpu, index);
        if (!read_line(path, type, sizeof type) || !strcmp(type, "Instruction")) continue;
        if (level ? this_level != level : this_level <= found.level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/size", cpu, index);
        if (!read_line(path, text, sizeof text) || parse_size(text) == 0) continue;
        found.level = this_level;
        found.size = parse_size(text);
        snprintf(found.type, sizeof found.type, "%s", type);
        snprintf(found.where, sizeof found.where, "/sys/devices/system/cpu/cpu%d/cache/index%d", cpu, index);
        found.source = "sysfs";
        any = true;
    }
    return any;
}

static bool from_sysconf(int level) {
    static const int names[] = {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE,
                                _SC_LEVEL4_CACHE_SIZE};
    for (int l = 4; l >= 1; l--) {
        if (level && l != level) continue;
        long size = sysconf(names[l - 1]);
        if (size > 0) {
            found.level = l;
            found.size = (uint64_t)size;
            snprintf(found.type, sizeof found.type, "%s", l == 1 ? "Data" : "Unified");
            found.source = "sysconf";
            return true;
        }
    }
    return false;
}

static int cache_prepare(rtv_stress *s) {
    int cpu = s->ctx.common.affinity.count ? s->ctx.common.affinity.cpu[0] : 0;
    int level = (int)opt.level;
    if (!from_sysfs(cpu, level) && from_sysconf(level))
        fprintf(stderr, "rtvirt-agent: note: no cache sizes in sysfs for CPU %d; using sysconf (CPUID): "
                        "L%d = %llu bytes\n", cpu, found.level, (unsigned long long)found.size);
    if (opt.buffer) found.buffer = opt.buffer;
    else if (found.size) found.buffer = found.size + found.size / 2;
    else {
        fprintf(stderr, "rtvirt-agent: --level %d: no such cache size in sysfs or sysconf for CPU %d; "
                        "give --buffer=BYTES\n", level, cpu);
        return RTV_EXIT_USAGE;
    }
    return 0;
}

static void cache_work(rtv_worker *w) {
    const uint64_t size = found.buffer;
    unsigned char *buf = aligned_alloc(64, (size + 63) / 64 * 64);
    if (!buf) {
        rtv_stress_fail(w->stress, "cache: cannot allocate %llu bytes", (unsigned long long)size);
        return;
    }
    for (int pass = 0; !rtv_stress_stopping(w); pass++) {
        uint64_t done = 0;
        while (done < size && !rtv_stress_stopping(w)) {
            uint64_t n = size - done < CHUNK ? size - done : CHUNK;
            memset(buf + done, pass, n);
            __asm__ __volatile__("" : : "r"(buf) : "memory"); /* the stores must happen: nothing reads them */
            done += n;
        }
        w->bytes += done;
        if (done == size) atomic_fetch_add_explicit(&w->ops, 1, memory_order_relaxed);
    }
    free(buf);
}

static void cache_report(rtv_stress *s, FILE *out) {
    (void)s;
    fprintf(out, ",\"cache\":{\"level\":%d,\"type\":\"%s\",\"size_bytes\":%llu,\"source\":\"%s\",\"sysfs\":\"%s\"}"
                 ",\"buffer_bytes\":%llu",
            found.level, found.type, (unsigned long long)found.size, found.source, found.where,
            (unsigned long long)found.buffer);
}

const rtv_stressor rtv_stressor_cache = {
    .name = "cache",
    .summary = "memset a buffer of 1.5 x the last-level (or --level) cache size, forever",
    .opts = cache_opts,
    .prepare = cache_prepare,
    .work = cache_work,
    .report = cache_report,
};
