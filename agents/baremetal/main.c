/* From the arch's boot to the probe: command line, stream, stolen time, interrupts, the tiny kernel, then the
 * probe's thread; and the way out (guest_exit, and the failures that take it).
 *
 * The command line is what rtvirt passes the Linux agent: "PROBE --name=value ..." (after the
 * kernel's file name, which multiboot loaders put first). Options are the same as the Linux
 * agent's (rtvirt.agents.agent_args renders the same pydantic models); a bad one stops the guest with
 * status 2 and a line naming the option, which rtvirt reports as bad input. */
#include "kernel.h"

static const probe_entry *probe;
static bool affinity_given;

static const probe_entry PROBES[] = {
    {&timer_desc, timer_run},       {&gap_desc, gap_run},
    {&kops_desc, kops_run},         {&threadmetric_desc, threadmetric_run},
    {&workload_desc, workload_run},
    {&stress_cpu_desc, stress_cpu_run}, {&stress_cache_desc, stress_cache_run}, /* stress.c: stressor guests */
};

typedef enum { OPT_U64, OPT_NS, OPT_BOOL, OPT_STR, OPT_CPU0, OPT_IGNORED } opt_type;
typedef struct {
    const char *name;
    opt_type type;
    void *dest;
    uint64_t min, max;
    const char *probe; /* NULL: every probe's option */
} option;

/* The Linux agent's options with its ranges; mlock and dma-latency have nothing to do here (no paging,
 * no C-states to hold off) but are accepted so one argv serves both agents. */
static bool ignored_flag;
static const option OPTIONS[] = {
    {"duration", OPT_NS, &P.duration_ns, 0, UINT64_MAX, NULL},
    {"loops", OPT_U64, &P.loops, 0, UINT64_MAX, NULL},
    {"threads", OPT_U64, &P.threads, 1, 1, NULL},
    {"priority", OPT_U64, &P.priority, 0, 99, NULL},
    {"affinity", OPT_CPU0, &affinity_given, 0, 0, NULL},
    {"mlock", OPT_BOOL, &ignored_flag, 0, 1, NULL},
    {"dma-latency", OPT_BOOL, &ignored_flag, 0, 1, NULL},
    {"confirm", OPT_STR, &P.confirm, 0, 0, NULL},
    {"confirm-timeout", OPT_NS, &P.confirm_timeout_ns, 1000000, 600000000000ull, NULL},
    {"interval", OPT_NS, &P.interval_ns, 10000, 10000000000ull, "timer"},
    {"distance", OPT_NS, &P.distance_ns, 0, 10000000000ull, "timer"},
    {"engine", OPT_STR, &P.engine, 0, 0, "timer"},
    {"threshold", OPT_NS, &P.threshold_ns, 1, 1000000000ull, "gap"},
    {"work", OPT_BOOL, &P.work, 0, 1, "gap"},
    {"work-unit", OPT_U64, &P.work_unit, 1, 1000000000ull, "gap"},
    {"iterations", OPT_U64, &P.iterations, 1, 100000000ull, "kops"},
    {"alloc-size", OPT_U64, &P.alloc_size, 1, 1ull << 30, "kops"},
    {"report-interval", OPT_NS, &P.report_interval_ns, 1000000, 3600000000000ull, "threadmetric"},
    {"kernel", OPT_STR, &P.kernel, 0, 0, "workload"},
    {"size", OPT_U64, &P.size, 1024, 1ull << 32, "workload"},
    {"slice", OPT_NS, &stress_slice_ns, 0, 10000000000ull, "cpu"},
    {"period", OPT_NS, &stress_period_ns, 0, 10000000000ull, "cpu"},
    {"level", OPT_U64, &stress_level, 0, 4, "cache"},
    {"buffer", OPT_U64, &stress_buffer, 0, 1ull << 32, "cache"},
};
enum { NOPTIONS = sizeof OPTIONS / sizeof OPTIONS[0] };
static bool given[NOPTIONS];


static bool parse_u64(const char *s, uint64_t *out) {
    if (!*s) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return false;
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* Cut the command line into words in place (no quoting: rtvirt's values never hold spaces). */
static int split(char *line, char **words, int max) {
    int n = 0;
    while (*line && n < max) {
        while (*line == ' ') *line++ = 0;
        if (!*line) break;
        words[n++] = line;
        while (*line && *line != ' ') line++;
    }
    return n;
}

static void set_option(const option *o, const char *value) {
    text t = {(char[200]){0}, 0, 200};
    text_char(&t, '\'');
    text_str(&t, value);
    text_str(&t, "' (");
    uint64_t v;
    switch (o->type) {
    case OPT_U64:
    case OPT_NS:
        if (!parse_u64(value, &v) || v < o->min || v > o->max) {
            text_str(&t, o->type == OPT_NS ? "a time in ns" : "an integer");
            text_str(&t, " from ");
            text_u64(&t, o->min);
            text_str(&t, " to ");
            text_u64(&t, o->max);
            text_str(&t, o->max == 1 && !strcmp(o->name, "threads") ? "; one CPU, one measuring thread)" : ")");
            usage_error(o->name, t.buf);
        }
        *(uint64_t *)o->dest = v;
        return;
    case OPT_BOOL:
        if (strcmp(value, "0") && strcmp(value, "1")) usage_error(o->name, (text_str(&t, "0 or 1)"), t.buf));
        *(bool *)o->dest = value[0] == '1';
        return;
    case OPT_STR:
        *(const char **)o->dest = value;
        return;
    case OPT_CPU0:
        if (strcmp(value, "0")) usage_error(o->name, (text_str(&t, "the bare-metal guest has one CPU: 0)"), t.buf));
        *(bool *)o->dest = true;
        return;
    case OPT_IGNORED:
        return;
    }
}

/* The options as run, every one with its value (defaults included), as the Linux agent echoes them. */
static void params_json(text *t) {
    text_char(t, '{');
    bool first = true;
    for (int i = 0; i < NOPTIONS; i++) {
        const option *o = &OPTIONS[i];
        if (o->probe && strcmp(o->probe, probe->desc->name)) continue;
        if (o->type == OPT_BOOL && o->dest == &ignored_flag) continue;
        if (!first) text_char(t, ',');
        first = false;
        text_char(t, '"');
        for (const char *c = o->name; *c; c++) text_char(t, *c == '-' ? '_' : *c);
        text_str(t, "\":");
        switch (o->type) {
        case OPT_U64:
        case OPT_NS: text_u64(t, *(uint64_t *)o->dest); break;
        case OPT_BOOL: text_str(t, *(bool *)o->dest ? "true" : "false"); break;
        case OPT_STR: text_json_str(t, *(const char **)o->dest); break;
        case OPT_CPU0: text_str(t, affinity_given ? "[0]" : "null"); break;
        case OPT_IGNORED: text_str(t, "null"); break;
        }
    }
    text_char(t, '}');
}

static void parse_command_line(char *line, bool skip_first_word) {
    static char *words[64];
    int n = split(line, words, 64);
    int first = skip_first_word && n ? 1 : 0; /* multiboot loaders (QEMU, GRUB) put the kernel's file name first */
    if (first >= n) usage_error(NULL, "no probe named on the kernel command line (timer, gap, kops, threadmetric "
                                      "or workload)");
    for (size_t i = 0; i < sizeof PROBES / sizeof PROBES[0]; i++)
        if (!strcmp(words[first], PROBES[i].desc->name)) probe = &PROBES[i];
    if (!probe) {
        text t = {(char[200]){0}, 0, 200};
        text_str(&t, "unknown probe '");
        text_str(&t, words[first]);
        text_str(&t, "' (the bare-metal guest runs timer, gap, kops, threadmetric and workload)");
        usage_error(NULL, t.buf);
    }
    for (int w = first + 1; w < n; w++) {
        const char *arg = words[w];
        char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) || !eq) {
            text t = {(char[200]){0}, 0, 200};
            text_str(&t, "unexpected argument '");
            text_str(&t, arg);
            text_str(&t, "' (options are --name=value)");
            usage_error(NULL, t.buf);
        }
        *eq = 0;
        const option *o = NULL;
        for (int i = 0; i < NOPTIONS; i++)
            if (!strcmp(OPTIONS[i].name, arg + 2) && (!OPTIONS[i].probe || !strcmp(OPTIONS[i].probe, probe->desc->name))) {
                o = &OPTIONS[i];
                given[i] = true;
            }
        if (!o) {
            text t = {(char[200]){0}, 0, 200};
            text_str(&t, "unknown option '");
            text_str(&t, arg);
            text_str(&t, "' for the bare-metal ");
            text_str(&t, probe->desc->name);
            text_str(&t, " probe");
            usage_error(NULL, t.buf);
        }
        set_option(o, eq + 1);
    }
    /* cross-checks the Linux agent makes too, and what only Linux can do */
    if (*P.confirm && strcmp(P.confirm, "virtio"))
        usage_error("confirm", "the bare-metal guest hears the host's confirmation on its virtio console: virtio");
    if (!strcmp(probe->desc->name, "timer") && strcmp(P.engine, "cyclictest"))
        usage_error("engine", "the bare-metal timer probe measures the " TIMER_NAME " itself; only 'cyclictest' "
                              "(the default) applies (timerlat is a Linux tracer)");
    if (!strcmp(probe->desc->name, "gap") && P.work)
        usage_error("work", "the bare-metal gap probe spins on the TSC only (--work is not supported)");
    if (!strcmp(probe->desc->name, "kops") && P.priority == 1)
        usage_error("priority", "kops needs at least 2 (the partner thread runs one above), or 0");
    if (!strcmp(probe->desc->name, "threadmetric") && P.priority < 6)
        usage_error("priority", "threadmetric needs at least 6 (its five threads take the priorities below it)");
    if (!strcmp(probe->desc->name, "cpu") && (!stress_slice_ns != !stress_period_ns || (stress_period_ns &&
                                                                                      stress_slice_ns >= stress_period_ns)))
        usage_error("slice", "--slice and --period go together, the slice shorter than the period");
    if (!strcmp(probe->desc->name, "workload") && strcmp(P.kernel, "qsort") && strcmp(P.kernel, "basicmath") &&
        strcmp(P.kernel, "bitcount"))
        usage_error("kernel", "choose qsort, basicmath or bitcount");
}

static void probe_thread(void *unused) {
    (void)unused;
    static char buf[2048];
    text t = {buf, 0, sizeof buf};
    params_json(&t);
    stream_begin(probe->desc, buf);
    run_started(); /* after the header: a slow channel's write is not the probe's run time */
    int status = probe->run();
    if (stop_requested) stop_now();
    stream_end(status ? 2 : 0);
    clock_exchange("end"); /* after the last sample: it disturbs no measurement */
    guest_exit(status);
}

/* ---- the way out ---- */

static void (*before_failure_exit)(int reason); /* stream_end, registered by kernel_main */

void on_guest_failure(void (*end)(int reason)) { before_failure_exit = end; }

_Noreturn void guest_exit(int status) {
    xen_console_flush();
    text t = {(char[32]){0}, 0, 32};
    text_str(&t, "RTVIRT-EXIT ");
    text_i64(&t, status);
    console_line(t.buf);
    platform_off(status);
}

void console_line(const char *s) {
    console_write(s, strlen(s));
    console_write("\n", 1);
}

static _Noreturn void fail(text *t, int status) {
    console_line(t->buf);
    if (before_failure_exit) before_failure_exit(2);
    guest_exit(status);
}

_Noreturn void usage_error(const char *option_name, const char *detail) {
    text t = {(char[400]){0}, 0, 400};
    text_str(&t, "rtvirt-baremetal: ");
    if (option_name) {
        text_str(&t, "invalid value for '--");
        text_str(&t, option_name);
        text_str(&t, "': ");
    }
    text_str(&t, detail);
    fail(&t, EXIT_USAGE);
}

_Noreturn void run_error(const char *detail) {
    text t = {(char[400]){0}, 0, 400};
    text_str(&t, "rtvirt-baremetal: ");
    text_str(&t, detail);
    fail(&t, EXIT_FAILURE);
}

const char *boot_kind = "none";

/* From the arch's boot, its console and counter ready. */
_Noreturn void kernel_main(const boot_info *boot) {
    /* the layers below reach up only through these: a failure ends the stream, a stop request ends the run */
    on_guest_failure(stream_end);
    on_stop_request(stream_stop);
    boot_kind = boot->kind;
    /* the host's boot watchdog waits for this line (rtvirt.environments.guest_image.READY_MARK) */
    text t = {(char[96]){0}, 0, 96};
    text_str(&t, "RTVIRT-READY ");
    text_u64(&t, now_ns() / 1000);
    text_str(&t, " us after reset (" TIMER_COUNTER " ");
    text_str(&t, cycles_source);
    text_char(&t, ')');
    console_line(t.buf);
    static char line[1024];
    uint64_t memory_top = boot->memory_top;
    arena_init(memory_top);
    if (boot->command_line) {
        size_t n = strlen(boot->command_line);
        if (n >= sizeof line) usage_error(NULL, "the kernel command line is longer than 1023 bytes");
        memcpy(line, boot->command_line, n + 1);
    }
    parse_command_line(line, boot->skip_first_word);
    stream_init();
    steal_init(); /* each sample's stolen time: Xen's runstate area, KVM's steal time */
    interrupts_init();
    timer_init();
    sched_init();
    clock_exchange("start"); /* an explained run: the host aligns its clock with ours (before the stream) */
    set_idle_work(stream_drain);
    thread_start(probe_thread, NULL, (int)(P.priority ? P.priority : 1), probe->desc->name);
    sched_run();
}
