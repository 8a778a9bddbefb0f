/* mix: the reference load of the COTS-hypervisor study: 10 workers spinning on sqrt plus 10 workers
 * doing malloc/touch/free of 64 MB blocks, enough to overload every core. Workers are placed in
 * order, cpu ones first: worker i runs on cpus[i % n]. */
#define _GNU_SOURCE
#include "stressors.h"

#define UNSET UINT64_MAX

static struct {
    uint64_t cpu_workers;
    uint64_t mem_workers;
} opt = {.cpu_workers = UNSET, .mem_workers = UNSET};

static const rtv_opt mix_opts[] = {
    {"cpu-workers", RTV_OPT_U64, &opt.cpu_workers, 0, RTV_STRESS_MAX_WORKERS / 2,
     "sqrt-spinning workers (default: --workers, else 10)"},
    {"mem-workers", RTV_OPT_U64, &opt.mem_workers, 0, RTV_STRESS_MAX_WORKERS / 2,
     "malloc/touch/free workers (default: --workers, else 10)"},
    {"block", RTV_OPT_U64, &rtv_mem_block_bytes, 4096, UINT64_C(1) << 40, "bytes per mem worker cycle"},
    {0},
};

/* --workers N means N of each kind, as stress-ng counts per stressor; the study's load is N = 10. */
static int mix_prepare(rtv_stress *s) {
    uint64_t each = s->workers_given ? s->workers : 10;
    uint64_t cpu = opt.cpu_workers == UNSET ? each : opt.cpu_workers;
    uint64_t mem = opt.mem_workers == UNSET ? each : opt.mem_workers;
    if (!cpu && !mem) {
        fprintf(stderr, "rtvirt-agent: --cpu-workers and --mem-workers are both 0: nothing to run\n");
        return RTV_EXIT_USAGE;
    }
    if (cpu > RTV_STRESS_MAX_WORKERS / 2 || mem > RTV_STRESS_MAX_WORKERS / 2) {
        fprintf(stderr, "rtvirt-agent: --workers: at most %d of each kind for mix\n", RTV_STRESS_MAX_WORKERS / 2);
        return RTV_EXIT_USAGE;
    }
    s->nparts = 0;
    if (cpu) s->parts[s->nparts++] = (rtv_stress_part){"cpu", rtv_cpu_work, (int)cpu};
    if (mem) s->parts[s->nparts++] = (rtv_stress_part){"mem", rtv_mem_work, (int)mem};
    return rtv_mem_prepare(s);
}

const rtv_stressor rtv_stressor_mix = {
    .name = "mix",
    .summary = "the reference load: 10 sqrt + 10 malloc/touch/free(64 MiB) workers",
    .opts = mix_opts,
    .prepare = mix_prepare,
};
