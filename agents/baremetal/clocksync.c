/* The guest's half of the host's clock exchange (rtvirt.explain.clocksync), over the second virtio console that
 * the host adds to an explained run, so that the host's trace (the VM layer: which host task held the vCPU off)
 * lines up with the samples. The same protocol as a Linux guest's /init speaks: the guest says
 * "RTVIRT-CLOCK <phase>", the host sends "P <seq>" lines, each answered at once with "R <seq> now at <ns> nsecs"
 * (our sample clock: now_ns), until the host sends "D". The host keeps the round trip with the least delay.
 * Once before the stream begins and once after it ended: no exchange disturbs a measurement. */
#include "kernel.h"

enum { CLOCK_CONSOLE = 1, REPLY_WAIT_NS = 5000000000ull };

static void say(vconsole *c, text *t) {
    text_char(t, '\n');
    vconsole_write(c, (const uint8_t *)t->buf, t->len);
}

void clock_exchange(const char *phase) {
    vconsole *c = vconsole_open(CLOCK_CONSOLE);
    if (!c) return;
    char line[64], out[80];
    text t = {out, 0, sizeof out};
    text_str(&t, "RTVIRT-CLOCK ");
    text_str(&t, phase);
    say(c, &t);
    /* a host that stopped answering ends the exchange after a bounded wait */
    while (vconsole_read_line(c, line, sizeof line, cycles() + ns_to_cycles(REPLY_WAIT_NS)) && line[0] == 'P' &&
           line[1] == ' ') {
        const char *seq = line + 2;
        size_t digits = 0;
        while (seq[digits] >= '0' && seq[digits] <= '9' && digits < 6) digits++;
        if (!digits || seq[digits]) return; /* not the host's line: no exchange */
        t.len = 0;
        text_str(&t, "R ");
        text_str(&t, seq);
        text_str(&t, " now at ");
        text_u64(&t, now_ns()); /* as late as it can be: the reply leaves right after */
        text_str(&t, " nsecs");
        say(c, &t);
    }
}
