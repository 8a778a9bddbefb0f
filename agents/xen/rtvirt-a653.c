/* rtvirt-a653: set or show the ARINC 653 schedule of a cpupool (xl has no command for it).
   argv: POOL_ID MAJOR_FRAME_NS then UUID VCPU RUNTIME_NS per window: sets it, prints nothing;
   argv: POOL_ID alone: prints "major_frame NS" and one "UUID VCPU RUNTIME_NS" line per window. */
#define __XEN_TOOLS__ 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xenctrl.h>

static int parse_uuid(const char *text, uint8_t out[16]) {
    int n = 0;
    for (const char *p = text; *p && n < 32; p++) {
        if (*p == '-') continue;
        char c = *p; int v;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
        else return -1;
        if (n % 2 == 0) out[n / 2] = (uint8_t)(v << 4); else out[n / 2] |= (uint8_t)v;
        n++;
    }
    return n == 32 ? 0 : -1;
}

static int show(uint32_t pool) {
    static struct xen_sysctl_arinc653_schedule schedule;
    xc_interface *xch = xc_interface_open(NULL, NULL, 0);
    if (!xch) { perror("rtvirt-a653: xc_interface_open"); return 1; }
    int rc = xc_sched_arinc653_schedule_get(xch, pool, &schedule);
    xc_interface_close(xch);
    if (rc != 0) { perror("rtvirt-a653: xc_sched_arinc653_schedule_get"); return 1; }
    printf("major_frame %llu\n", (unsigned long long)schedule.major_frame);
    for (int i = 0; i < schedule.num_sched_entries && i < ARINC653_MAX_DOMAINS_PER_SCHEDULE; i++) {
        const uint8_t *h = schedule.sched_entries[i].dom_handle;
        for (int b = 0; b < 16; b++) printf("%02x%s", h[b], (b == 3 || b == 5 || b == 7 || b == 9) ? "-" : "");
        printf(" %u %llu\n", schedule.sched_entries[i].vcpu_id,
               (unsigned long long)schedule.sched_entries[i].runtime);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2) return show((uint32_t)strtoul(argv[1], NULL, 10));
    if (argc < 6 || (argc - 3) % 3 != 0 || (argc - 3) / 3 > ARINC653_MAX_DOMAINS_PER_SCHEDULE) {
        fprintf(stderr, "usage: rtvirt-a653 POOL_ID MAJOR_FRAME_NS (UUID VCPU RUNTIME_NS)...\n");
        return 2;
    }
    static struct xen_sysctl_arinc653_schedule schedule;
    memset(&schedule, 0, sizeof(schedule));
    uint32_t pool = (uint32_t)strtoul(argv[1], NULL, 10);
    schedule.major_frame = strtoull(argv[2], NULL, 10);
    schedule.num_sched_entries = (uint8_t)((argc - 3) / 3);
    for (int i = 0; i < schedule.num_sched_entries; i++) {
        if (parse_uuid(argv[3 + 3 * i], schedule.sched_entries[i].dom_handle) != 0) {
            fprintf(stderr, "rtvirt-a653: bad UUID %.40s\n", argv[3 + 3 * i]);
            return 2;
        }
        schedule.sched_entries[i].vcpu_id = (uint32_t)strtoul(argv[4 + 3 * i], NULL, 10);
        schedule.sched_entries[i].runtime = strtoull(argv[5 + 3 * i], NULL, 10);
    }
    xc_interface *xch = xc_interface_open(NULL, NULL, 0);
    if (!xch) { perror("rtvirt-a653: xc_interface_open"); return 1; }
    int rc = xc_sched_arinc653_schedule_set(xch, pool, &schedule);
    if (rc != 0) { perror("rtvirt-a653: xc_sched_arinc653_schedule_set"); xc_interface_close(xch); return 1; }
    xc_interface_close(xch);
    return 0;
}
