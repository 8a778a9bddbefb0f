/* mix: the reference load of the COTS-hypervisor study: 10 workers spinning on sqrt plus 10 workers
 * doing malloc/touch/free of 64 MB blocks, enough to overload every core. Workers are placed in
 * order, cpu ones first: worker i runs on cpus[i % n]. */
#define _GNU_SOURCE
#include "stressors.h"

static struct {
    uint64_t cpu_workers;
    uint64_t mem_workers;
} opt = {.cpu_workers = 10, .mem_workers = 10};

static const rtv_opt mix_opts[] = {
    {"cpu-workers", RTV_OPT_U64, &opt.cpu_workers, 0, RTV_STRESS_MAX_WORKERS / 2, "sqrt-spinning workers"},
    {"mem-workers", RTV_OPT_U64, &opt.mem_workers, 0, RTV_STRESS_MAX_WORKERS / 2, "malloc/touch/free workers"},
    {"block", RTV_OPT_U64, &rtv_mem_block_bytes, 4096, UINT64_C(1) << 40, "bytes per mem worker cycle"},
    {0},
};

static int mix_prepare(rtv_stress *s) {
    if (s->workers_given) {
        fprintf(stderr, "rtvirt-agent: --workers does not apply to mix; use --cpu-workers and --mem-workers\n");
        return RTV_EXIT_USAGE;
    }
    if (!opt.cpu_workers && !opt.mem_workers) {
        fprintf(stderr, "rtvirt-agent: --cpu-workers and --mem-workers are both 0: nothing to run\n");
        return RTV_EXIT_USAGE;
    }
    s->nparts = 0;
    if (opt.cpu_workers) s->parts[s->nparts++] = (rtv_stress_part){"cpu", rtv_cpu_work, (int)opt.cpu_workers};
    if (opt.mem_workers) s->parts[s->nparts++] = (rtv_stress_part){"mem", rtv_mem_work, (int)opt.mem_workers};
    return rtv_mem_prepare(s);
}

const rtv_stressor rtv_stressor_mix = {
    .name = "mix",
    .summary = "the reference load: 10 sqrt + 10 malloc/touch/free(64 MiB) workers",
    .opts = mix_opts,
    .prepare = mix_prepare,
};
