/* rtvirt-trace: a Linux guest's own trace, relayed while the run goes (the guest layer's flight recorder:
 * src/rtvirt/explain/guest_channel.py starts it, src/rtvirt/explain/guest_stream.py keeps what it sends).
 *
 *   rtvirt-trace INSTANCE_DIR CPU...
 *
 * Every DRAIN_MS it reads each CPU's INSTANCE_DIR/per_cpu/cpuN/trace_pipe until the pipe is empty and writes what
 * it read to stdout (the guest's rtvirt.trace port, or nc towards dom0). The pipes are non-blocking: a reader
 * blocked in a trace_pipe is woken as events come (Linux 6.1), and each of its wake-ups makes events of its own;
 * this one wakes on its own timer only. It keeps off the traced CPUs when the guest has others. SIGTERM or
 * SIGINT (tracing is off by then): a last drain, then exit 0. Each read of a trace_pipe returns whole lines, and
 * each is written whole, so lines of several CPUs never mix within a line. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DRAIN_MS 500
/* Bytes per read: the kernel formats events until a read's size is filled, in a stretch a task of the guest's
 * (the measuring one) may have to wait out on a kernel without full preemption; a page took up to 3 ms under TCG. */
#define READ_BYTES 2048
#define MAX_CPUS 64

static volatile sig_atomic_t stopping;

static void on_stop(int sig) {
    (void)sig;
    stopping = 1;
}

/* Write all of buf to stdout; false when the reader has gone (then nothing more can be relayed). */
static bool write_all(const char *buf, size_t n) {
    while (n > 0) {
        ssize_t done = write(STDOUT_FILENO, buf, n);
        if (done < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        buf += done;
        n -= (size_t)done;
    }
    return true;
}

/* Read one pipe until it is empty; false when stdout has gone. */
static bool drain(int fd) {
    static char buf[READ_BYTES];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return true; /* EAGAIN: empty for now */
        if (!write_all(buf, (size_t)n)) return false;
    }
}

/* Run on the CPUs that are not traced, when there are any (the relay is the instrument's own noise). */
static void keep_off(const int *cpus, int n) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    cpu_set_t others = set;
    for (int i = 0; i < n; i++) CPU_CLR(cpus[i], &others);
    if (CPU_COUNT(&others) > 0) sched_setaffinity(0, sizeof others, &others);
}

int main(int argc, char **argv) {
    if (argc < 3 || argc - 2 > MAX_CPUS) {
        fprintf(stderr, "usage: rtvirt-trace INSTANCE_DIR CPU... (at most %d CPUs)\n", MAX_CPUS);
        return 2;
    }
    int fds[MAX_CPUS], cpus[MAX_CPUS], n = argc - 2;
    for (int i = 0; i < n; i++) {
        char *end;
        long cpu = strtol(argv[i + 2], &end, 10);
        if (*end || cpu < 0 || cpu >= CPU_SETSIZE) {
            fprintf(stderr, "rtvirt-trace: not a CPU number: %s\n", argv[i + 2]);
            return 2;
        }
        char path[512];
        snprintf(path, sizeof path, "%s/per_cpu/cpu%ld/trace_pipe", argv[1], cpu);
        fds[i] = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (fds[i] < 0) {
            fprintf(stderr, "rtvirt-trace: cannot open %s: %s\n", path, strerror(errno));
            return 1;
        }
        cpus[i] = (int)cpu;
    }
    struct sigaction stop = {.sa_handler = on_stop};
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGINT, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    keep_off(cpus, n);
    const struct timespec pause = {.tv_sec = DRAIN_MS / 1000, .tv_nsec = (DRAIN_MS % 1000) * 1000000L};
    for (;;) {
        bool last = stopping; /* read once more after the stop: what came before it */
        for (int i = 0; i < n; i++)
            if (!drain(fds[i])) return 1;
        if (last) break;
        nanosleep(&pause, NULL); /* a signal ends the pause early */
    }
    for (int i = 0; i < n; i++) close(fds[i]);
    return 0;
}
