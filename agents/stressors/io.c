/* io: write a file, fsync it, drop it from the page cache and read it back, again and again: block
 * I/O, journal commits and their interrupts (the disk-heavy neighbour the studies wanted next).
 *
 * The file never has a name: O_TMPFILE in --path (or, where the file system lacks it, a mkstemp file
 * unlinked at once). Its blocks go back to the file system when the worker closes it, and even a
 * SIGKILL leaves nothing behind. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stressors.h"

static struct {
    const char *path;
    uint64_t size;
} opt = {.path = "/var/tmp", .size = UINT64_C(16) << 20};

static const rtv_opt io_opts[] = {
    {"path", RTV_OPT_STR, &opt.path, 0, 0, "directory of the (nameless) work files"},
    {"size", RTV_OPT_U64, &opt.size, 4096, UINT64_C(1) << 40, "bytes written and read back per cycle"},
    {0},
};

enum { CHUNK = 1 << 20 };
static const char *file_kind = "O_TMPFILE";

static int io_prepare(rtv_stress *s) {
    (void)s;
    struct stat st;
    if (stat(opt.path, &st) != 0 || !S_ISDIR(st.st_mode) || access(opt.path, W_OK | X_OK) != 0) {
        fprintf(stderr, "rtvirt-agent: --path '%s' is not a writable directory\n", opt.path);
        return RTV_EXIT_USAGE;
    }
    return 0;
}

static int open_nameless(void) {
    int fd = open(opt.path, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
    char name[4096];
    snprintf(name, sizeof name, "%s/rtvirt-stress-io-XXXXXX", opt.path);
    fd = mkostemp(name, O_CLOEXEC);
    if (fd >= 0) {
        unlink(name);
        file_kind = "unlinked";
    }
    return fd;
}

/* Returns false (after reporting) on an I/O error. */
static bool transfer(rtv_worker *w, int fd, unsigned char *buf, bool writing) {
    for (uint64_t off = 0; off < opt.size && !rtv_stress_stopping(w);) {
        size_t n = opt.size - off < CHUNK ? (size_t)(opt.size - off) : CHUNK;
        ssize_t done = writing ? pwrite(fd, buf, n, (off_t)off) : pread(fd, buf, n, (off_t)off);
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) {
            rtv_stress_fail(w->stress, "io: %s in %s failed: %s", writing ? "write" : "read", opt.path,
                            done < 0 ? strerror(errno) : "short file");
            return false;
        }
        off += (uint64_t)done;
        w->bytes += (uint64_t)done;
    }
    return true;
}

static void io_work(rtv_worker *w) {
    int fd = open_nameless();
    if (fd < 0) {
        rtv_stress_fail(w->stress, "io: cannot create a file in %s: %s", opt.path, strerror(errno));
        return;
    }
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        rtv_stress_fail(w->stress, "io: out of memory");
        return;
    }
    for (unsigned pass = 0; !rtv_stress_stopping(w); pass++) {
        memset(buf, (int)(pass + (unsigned)w->index), CHUNK);
        if (!transfer(w, fd, buf, true)) break;
        if (rtv_stress_stopping(w)) break;
        if (fsync(fd) != 0 && errno != EINTR) {
            rtv_stress_fail(w->stress, "io: fsync in %s failed: %s", opt.path, strerror(errno));
            break;
        }
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* so the read-back comes from the device */
        if (!transfer(w, fd, buf, false)) break;
        if (!rtv_stress_stopping(w)) atomic_fetch_add_explicit(&w->ops, 1, memory_order_relaxed);
    }
    free(buf);
    close(fd);
}

static void io_report(rtv_stress *s, FILE *out) {
    (void)s;
    fputs(",\"path\":\"", out);
    for (const char *c = opt.path; *c; c++) /* user text: escape for JSON */
        if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
        else if ((unsigned char)*c < 0x20) fprintf(out, "\\u%04x", (unsigned char)*c);
        else fputc(*c, out);
    fprintf(out, "\",\"file_bytes\":%llu,\"file\":\"%s\"", (unsigned long long)opt.size, file_kind);
}

const rtv_stressor rtv_stressor_io = {
    .name = "io",
    .summary = "write, fsync, drop from cache and read back a nameless file in --path",
    .opts = io_opts,
    .prepare = io_prepare,
    .work = io_work,
    .report = io_report,
};
