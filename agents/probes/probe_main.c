/* rtvirt-probe NAME [--option=value ...]: run one probe and write its sample stream. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "probes.h"

#define RTV_PROBE_ENTRY(name) &rtv_probe_##name,
static const rtv_probe *const probes[] = {RTV_PROBE_LIST(RTV_PROBE_ENTRY)};
#undef RTV_PROBE_ENTRY
#define NPROBES (sizeof probes / sizeof probes[0])

static rtv_ctx ctx = {
    .common = {.threads = 1, .priority = 99, .mlock = true, .dma_latency = true, .out = "-", .tee = "", .ring_order = 16,
               .confirm = "", .confirm_timeout_ns = UINT64_C(30000000000)},
};

static const rtv_opt common_opts[] = {
    {"duration", RTV_OPT_NS, &ctx.common.duration_ns, 0, UINT64_MAX, "run time in ns, 0 = until loops or signal"},
    {"loops", RTV_OPT_U64, &ctx.common.loops, 0, UINT64_MAX, "samples per thread, 0 = unlimited"},
    {"threads", RTV_OPT_U64, &ctx.common.threads, 1, RTV_MAX_THREADS, "measuring threads"},
    {"priority", RTV_OPT_U64, &ctx.common.priority, 0, 99, "SCHED_FIFO priority, 0 = SCHED_OTHER"},
    {"mlock", RTV_OPT_BOOL, &ctx.common.mlock, 0, 1, "lock memory (mlockall)"},
    {"dma-latency", RTV_OPT_BOOL, &ctx.common.dma_latency, 0, 1, "hold /dev/cpu_dma_latency at 0"},
    {"affinity", RTV_OPT_CPUS, &ctx.common.affinity, 0, 0, "CPU list; thread i runs on the i-th (cycling)"},
    {"out", RTV_OPT_STR, &ctx.common.out, 0, 0, "output file, - for stdout"},
    {"tee", RTV_OPT_STR, &ctx.common.tee, 0, 0, "also write the stream to this file"},
    {"watch-stdin", RTV_OPT_BOOL, &ctx.common.watch_stdin, 0, 1, "stop when stdin ends (dies with its session)"},
    {"confirm", RTV_OPT_STR, &ctx.common.confirm, 0, 0,
     "after END, wait for the host's 'RTVIRT-ACK <records>' line on this channel"},
    {"confirm-timeout", RTV_OPT_NS, &ctx.common.confirm_timeout_ns, 0, UINT64_C(3600000000000),
     "how long to wait for that confirmation"},
    {"ring-order", RTV_OPT_U64, &ctx.common.ring_order, 8, 26, "ring capacity per thread, 2^n records"},
    {0},
};

static void usage(void) {
    fprintf(stderr, "usage: rtvirt-probe NAME [--option=value ...]\n"
                    "       rtvirt-probe --list | --cycles-hz\n\ncommon options:\n");
    rtv_print_options(common_opts);
    for (size_t i = 0; i < NPROBES; i++) {
        fprintf(stderr, "\n%s: %s\n", probes[i]->name, probes[i]->summary);
        rtv_print_options(probes[i]->opts);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        usage();
        return argc < 2 ? RTV_EXIT_USAGE : RTV_EXIT_OK;
    }
    if (!strcmp(argv[1], "--cycles-hz")) { /* the cycle counter's rate: a TCG guest's TSC runs at it */
        printf("%.0f\n", rtv_cycles_hz());
        return RTV_EXIT_OK;
    }
    if (!strcmp(argv[1], "--list")) {
        for (size_t i = 0; i < NPROBES; i++) printf("%s\n", probes[i]->name);
        return RTV_EXIT_OK;
    }
    for (size_t i = 0; i < NPROBES; i++)
        if (!strcmp(argv[1], probes[i]->name)) ctx.probe = probes[i];
    if (!ctx.probe) rtv_die(RTV_EXIT_USAGE, "unknown probe '%s' (try --list)", argv[1]);

    const rtv_opt *const tables[] = {common_opts, ctx.probe->opts};
    rtv_parse_options(tables, 2, argc - 2, argv + 2);
    if (ctx.probe->resolve) ctx.probe = ctx.probe->resolve();
    if (ctx.probe->validate && ctx.probe->validate(&ctx.common) != 0) return RTV_EXIT_USAGE;
    rtv_install_signal_handlers();
    rtv_ctx_start(&ctx, tables, 2);
    int status = ctx.probe->run(&ctx);
    return rtv_ctx_finish(&ctx, status);
}
