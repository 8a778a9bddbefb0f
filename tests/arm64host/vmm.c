/* rtvb-vmm: a tiny VMM that runs rtvirt's aarch64 bare-metal kernel under Linux KVM on arm64, for
 * tests/test_baremetal_armkvm.py (it runs inside Debian's arm64 kernel booted at EL2 by qemu-system-aarch64).
 *
 *   rtvb-vmm run IMAGE CMDLINE OUT [--gic=2|3] [--cpu=N] [--no-pvtime]
 *       one vCPU with 128 MiB of RAM at 0x40000000, the Image 2 MiB in (as QEMU puts it), a device tree we write
 *       (memory, chosen, PSCI over HVC, the generic timer, the GIC, a PL011, one virtio-mmio console), the
 *       in-kernel vGIC (KVM_CREATE_DEVICE), KVM's stolen-time structure (KVM_ARM_VCPU_PVTIME_CTRL); the PL011's
 *       bytes go to stdout, the virtio console's to OUT; it ends when the guest calls PSCI SYSTEM_OFF.
 *   rtvb-vmm hog CPU PRIORITY SLICE_US PERIOD_US SECONDS
 *       a SCHED_FIFO thread on CPU, busy SLICE_US of every PERIOD_US: the host task that takes the vCPU's CPU.
 *
 * Written from the Linux KVM API documentation (Documentation/virt/kvm/api.rst, devices/arm-vgic*.rst,
 * devices/vcpu.rst), the Devicetree Specification and the virtio specification's MMIO transport. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { RAM_BASE = 0x40000000u, RAM_BYTES = 128u << 20, IMAGE_OFFSET = 2u << 20, DTB_OFFSET = 96u << 20 };
enum { GICD = 0x08000000u, GICC = 0x08010000u, GICR = 0x080a0000u, UART = 0x09000000u, PVTIME = 0x090a0000u,
       VIRTIO = 0x0a000000u, VIRTIO_SPI = 16 };

static uint8_t *ram;

static void die(const char *what) {
    fprintf(stderr, "rtvb-vmm: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void *guest(uint64_t addr) {
    if (addr < RAM_BASE || addr >= RAM_BASE + (uint64_t)RAM_BYTES) {
        fprintf(stderr, "rtvb-vmm: guest address %#llx outside RAM\n", (unsigned long long)addr);
        exit(1);
    }
    return ram + (addr - RAM_BASE);
}

/* ---- a device tree, written as the Devicetree Specification's flattened format ---- */

static uint8_t fdt_struct[8192], fdt_strings[1024];
static size_t struct_len, strings_len;

static void put32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}
static void token(uint32_t t) {
    put32(fdt_struct + struct_len, t);
    struct_len += 4;
}
static void bytes(const void *p, size_t n) {
    memcpy(fdt_struct + struct_len, p, n);
    struct_len += n;
    while (struct_len % 4) fdt_struct[struct_len++] = 0;
}
static void begin(const char *name) {
    token(1);
    bytes(name, strlen(name) + 1);
}
static void end(void) { token(2); }
static void prop(const char *name, const void *value, size_t n) {
    size_t at = 0;
    while (at < strings_len && strcmp((char *)fdt_strings + at, name)) at += strlen((char *)fdt_strings + at) + 1;
    if (at >= strings_len) {
        memcpy(fdt_strings + strings_len, name, strlen(name) + 1);
        strings_len += strlen(name) + 1;
    }
    token(3);
    token((uint32_t)n);
    token((uint32_t)at);
    bytes(value, n);
}
static void prop_str(const char *name, const char *s) { prop(name, s, strlen(s) + 1); }
static void prop_cells(const char *name, const uint32_t *cells, size_t n) {
    uint8_t buf[64];
    for (size_t i = 0; i < n; i++) put32(buf + 4 * i, cells[i]);
    prop(name, buf, 4 * n);
}
static void prop_strings(const char *name, const char *a, const char *b) {
    char buf[128];
    size_t la = strlen(a) + 1, lb = strlen(b) + 1;
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    prop(name, buf, la + lb);
}

static size_t write_dtb(uint8_t *out, const char *cmdline, int gic) {
    begin("");
    prop_cells("#address-cells", (uint32_t[]){2}, 1);
    prop_cells("#size-cells", (uint32_t[]){2}, 1);
    prop_str("compatible", "linux,dummy-virt");
    begin("chosen");
    prop_str("bootargs", cmdline);
    prop_str("stdout-path", "/pl011@9000000");
    end();
    begin("memory@40000000");
    prop_str("device_type", "memory");
    prop_cells("reg", (uint32_t[]){0, RAM_BASE, 0, RAM_BYTES}, 4);
    end();
    begin("psci");
    prop_strings("compatible", "arm,psci-1.0", "arm,psci-0.2");
    prop_str("method", "hvc");
    end();
    begin("timer");
    prop_str("compatible", "arm,armv8-timer");
    prop_cells("interrupts", (uint32_t[]){1, 13, 0xf08, 1, 14, 0xf08, 1, 11, 0xf08, 1, 10, 0xf08}, 12);
    end();
    begin("intc@8000000");
    if (gic == 3) {
        prop_str("compatible", "arm,gic-v3");
        prop_cells("reg", (uint32_t[]){0, GICD, 0, 0x10000, 0, GICR, 0, 0x20000}, 8);
    } else {
        prop_str("compatible", "arm,cortex-a15-gic");
        prop_cells("reg", (uint32_t[]){0, GICD, 0, 0x10000, 0, GICC, 0, 0x10000}, 8);
    }
    prop_cells("#interrupt-cells", (uint32_t[]){3}, 1);
    prop("interrupt-controller", "", 0);
    end();
    begin("pl011@9000000");
    prop_strings("compatible", "arm,pl011", "arm,primecell");
    prop_cells("reg", (uint32_t[]){0, UART, 0, 0x1000}, 4);
    end();
    begin("virtio_mmio@a000000");
    prop_str("compatible", "virtio,mmio");
    prop_cells("reg", (uint32_t[]){0, VIRTIO, 0, 0x200}, 4);
    prop_cells("interrupts", (uint32_t[]){0, VIRTIO_SPI, 1}, 3);
    end();
    end();
    token(9);
    size_t header = 40, rsvmap = 16, total = header + rsvmap + struct_len + strings_len;
    memset(out, 0, header + rsvmap);
    put32(out, 0xd00dfeed);
    put32(out + 4, (uint32_t)total);
    put32(out + 8, (uint32_t)(header + rsvmap));                 /* off_dt_struct */
    put32(out + 12, (uint32_t)(header + rsvmap + struct_len));   /* off_dt_strings */
    put32(out + 16, (uint32_t)header);                           /* off_mem_rsvmap */
    put32(out + 20, 17);
    put32(out + 24, 16);
    put32(out + 32, (uint32_t)strings_len);
    put32(out + 36, (uint32_t)struct_len);
    memcpy(out + header + rsvmap, fdt_struct, struct_len);
    memcpy(out + header + rsvmap + struct_len, fdt_strings, strings_len);
    return total;
}

/* ---- a virtio-mmio console (legacy, version 1): the transmit queue's buffers go to OUT ---- */

struct vq {
    uint32_t num, align, pfn;
    uint16_t last_avail;
};
static struct {
    uint32_t status, queue_sel, page_size, features_sel;
    struct vq q[2];
} vio = {.page_size = 4096};
static FILE *stream_out;
static uint64_t stream_bytes;

static void transmit(struct vq *q) {
    if (!q->pfn || !q->num) return;
    uint64_t base = (uint64_t)q->pfn * vio.page_size;
    uint8_t *desc = guest(base), *avail = desc + 16 * q->num;
    uint64_t used_at = (base + 16 * q->num + 4 + 2 * q->num + q->align - 1) & ~(uint64_t)(q->align - 1);
    uint8_t *used = guest(used_at);
    uint16_t avail_idx = *(volatile uint16_t *)(avail + 2);
    __sync_synchronize();
    while (q->last_avail != avail_idx) {
        uint16_t head = *(uint16_t *)(avail + 4 + 2 * (q->last_avail % q->num)), d = head;
        uint32_t total = 0;
        for (;;) {
            uint8_t *e = desc + 16 * d;
            uint64_t addr;
            uint32_t len;
            uint16_t flags, next;
            memcpy(&addr, e, 8);
            memcpy(&len, e + 8, 4);
            memcpy(&flags, e + 12, 2);
            memcpy(&next, e + 14, 2);
            fwrite(guest(addr), 1, len, stream_out);
            total += len;
            if (!(flags & 1)) break;
            d = next;
        }
        uint16_t used_idx = *(uint16_t *)(used + 2);
        uint8_t *elem = used + 4 + 8 * (used_idx % q->num);
        uint32_t id = head;
        memcpy(elem, &id, 4);
        memcpy(elem + 4, &total, 4);
        __sync_synchronize();
        *(volatile uint16_t *)(used + 2) = used_idx + 1;
        q->last_avail++;
        stream_bytes += total;
    }
    fflush(stream_out);
}

static uint32_t virtio_read(uint64_t off) {
    switch (off) {
    case 0x000: return 0x74726976; /* "virt" */
    case 0x004: return 1;
    case 0x008: return 3; /* console */
    case 0x00c: return 0x554d4551;
    case 0x034: return 64; /* QueueNumMax */
    case 0x040: return vio.q[vio.queue_sel & 1].pfn;
    case 0x070: return vio.status;
    default: return 0;
    }
}

static void virtio_write(uint64_t off, uint32_t v) {
    struct vq *q = &vio.q[vio.queue_sel & 1];
    switch (off) {
    case 0x028: vio.page_size = v; break;
    case 0x030: vio.queue_sel = v; break;
    case 0x038: q->num = v; break;
    case 0x03c: q->align = v; break;
    case 0x040: q->pfn = v; q->last_avail = 0; break;
    case 0x050: if (v == 1) transmit(&vio.q[1]); break;
    case 0x070: vio.status = v; if (!v) memset(vio.q, 0, sizeof vio.q); break;
    default: break;
    }
}

/* ---- the VM ---- */

static void set_attr(int fd, uint32_t group, uint64_t attr, void *value, const char *what) {
    struct kvm_device_attr a = {.group = group, .attr = attr, .addr = (uint64_t)(uintptr_t)value};
    if (ioctl(fd, KVM_SET_DEVICE_ATTR, &a) < 0) die(what);
}

static void set_reg(int vcpu, uint64_t id, uint64_t value) {
    struct kvm_one_reg reg = {.id = id, .addr = (uint64_t)(uintptr_t)&value};
    if (ioctl(vcpu, KVM_SET_ONE_REG, &reg) < 0) die("KVM_SET_ONE_REG");
}

#define CORE_REG(field) (KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | (offsetof(struct kvm_regs, field) / 4))

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) < 0) die("sched_setaffinity");
}

static int run(int argc, char **argv) {
    if (argc < 5) return fprintf(stderr, "usage: rtvb-vmm run IMAGE CMDLINE OUT [--gic=N] [--cpu=N] [--no-pvtime]\n"), 2;
    int gic = 2, cpu = -1, pvtime = 1;
    for (int i = 5; i < argc; i++) {
        if (!strncmp(argv[i], "--gic=", 6)) gic = atoi(argv[i] + 6);
        else if (!strncmp(argv[i], "--cpu=", 6)) cpu = atoi(argv[i] + 6);
        else if (!strcmp(argv[i], "--no-pvtime")) pvtime = 0;
    }
    pin(cpu);
    stream_out = fopen(argv[4], "wb");
    if (!stream_out) die(argv[4]);
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0) die("/dev/kvm");
    int vm = ioctl(kvm, KVM_CREATE_VM, 0);
    if (vm < 0) die("KVM_CREATE_VM");
    ram = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *pv_page = mmap(NULL, 0x10000, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ram == MAP_FAILED || pv_page == MAP_FAILED) die("mmap");
    struct kvm_userspace_memory_region region = {.slot = 0, .guest_phys_addr = RAM_BASE, .memory_size = RAM_BYTES,
                                                 .userspace_addr = (uint64_t)(uintptr_t)ram};
    if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) < 0) die("KVM_SET_USER_MEMORY_REGION");
    region = (struct kvm_userspace_memory_region){.slot = 1, .guest_phys_addr = PVTIME, .memory_size = 0x10000,
                                                  .userspace_addr = (uint64_t)(uintptr_t)pv_page};
    if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) < 0) die("KVM_SET_USER_MEMORY_REGION (PV time)");

    int image = open(argv[2], O_RDONLY);
    if (image < 0) die(argv[2]);
    ssize_t n = read(image, ram + IMAGE_OFFSET, RAM_BYTES - IMAGE_OFFSET);
    if (n <= 0) die("reading the image");
    close(image);
    write_dtb(ram + DTB_OFFSET, argv[3], gic);

    int vcpu = ioctl(vm, KVM_CREATE_VCPU, 0);
    if (vcpu < 0) die("KVM_CREATE_VCPU");
    struct kvm_vcpu_init init;
    if (ioctl(vm, KVM_ARM_PREFERRED_TARGET, &init) < 0) die("KVM_ARM_PREFERRED_TARGET");
    init.features[0] |= 1u << KVM_ARM_VCPU_PSCI_0_2;
    if (ioctl(vcpu, KVM_ARM_VCPU_INIT, &init) < 0) die("KVM_ARM_VCPU_INIT");
    set_reg(vcpu, CORE_REG(regs.pc), RAM_BASE + IMAGE_OFFSET);
    set_reg(vcpu, CORE_REG(regs.regs[0]), RAM_BASE + DTB_OFFSET);

    struct kvm_create_device dev = {.type = gic == 3 ? KVM_DEV_TYPE_ARM_VGIC_V3 : KVM_DEV_TYPE_ARM_VGIC_V2};
    if (ioctl(vm, KVM_CREATE_DEVICE, &dev) < 0) die("KVM_CREATE_DEVICE (vGIC)");
    uint64_t dist = GICD, other = gic == 3 ? GICR : GICC;
    uint32_t irqs = 64 + 32;
    set_attr(dev.fd, KVM_DEV_ARM_VGIC_GRP_ADDR, gic == 3 ? KVM_VGIC_V3_ADDR_TYPE_DIST : KVM_VGIC_V2_ADDR_TYPE_DIST,
             &dist, "vGIC distributor address");
    set_attr(dev.fd, KVM_DEV_ARM_VGIC_GRP_ADDR, gic == 3 ? KVM_VGIC_V3_ADDR_TYPE_REDIST : KVM_VGIC_V2_ADDR_TYPE_CPU,
             &other, "vGIC CPU interface / redistributor address");
    set_attr(dev.fd, KVM_DEV_ARM_VGIC_GRP_NR_IRQS, 0, &irqs, "vGIC interrupts");
    set_attr(dev.fd, KVM_DEV_ARM_VGIC_GRP_CTRL, KVM_DEV_ARM_VGIC_CTRL_INIT, NULL, "vGIC init");

    if (pvtime) {
        uint64_t ipa = PVTIME;
        set_attr(vcpu, KVM_ARM_VCPU_PVTIME_CTRL, KVM_ARM_VCPU_PVTIME_IPA, &ipa, "KVM_ARM_VCPU_PVTIME_IPA");
    }

    int size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    struct kvm_run *r = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
    if (r == MAP_FAILED) die("mmap kvm_run");
    fprintf(stderr, "rtvb-vmm: vGIC v%d, PV time %s, vCPU on CPU %d\n", gic, pvtime ? "on" : "off", cpu);
    for (;;) {
        if (ioctl(vcpu, KVM_RUN, 0) < 0) {
            if (errno == EINTR) continue;
            die("KVM_RUN");
        }
        if (r->exit_reason == KVM_EXIT_MMIO) {
            uint64_t addr = r->mmio.phys_addr;
            uint32_t value = 0;
            memcpy(&value, r->mmio.data, r->mmio.len < 4 ? r->mmio.len : 4);
            if (addr >= UART && addr < UART + 0x1000) {
                if (r->mmio.is_write && addr == UART) {
                    putchar((int)(value & 0xff));
                    if ((value & 0xff) == '\n') fflush(stdout);
                } else if (!r->mmio.is_write) {
                    memset(r->mmio.data, 0, sizeof r->mmio.data); /* FR: never full */
                }
            } else if (addr >= VIRTIO && addr < VIRTIO + 0x200) {
                if (r->mmio.is_write) virtio_write(addr - VIRTIO, value);
                else {
                    value = virtio_read(addr - VIRTIO);
                    memcpy(r->mmio.data, &value, 4);
                }
            } else if (!r->mmio.is_write) {
                memset(r->mmio.data, 0, sizeof r->mmio.data);
            }
        } else if (r->exit_reason == KVM_EXIT_SYSTEM_EVENT) {
            fflush(stdout);
            fclose(stream_out);
            fprintf(stderr, "rtvb-vmm: system event %u, %llu stream bytes\n", r->system_event.type,
                    (unsigned long long)stream_bytes);
            return 0;
        } else {
            fprintf(stderr, "rtvb-vmm: unexpected exit %u\n", r->exit_reason);
            return 1;
        }
    }
}

/* ---- the host task: busy slice of every period at SCHED_FIFO ---- */

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int hog(int argc, char **argv) {
    if (argc < 7) return fprintf(stderr, "usage: rtvb-vmm hog CPU PRIORITY SLICE_US PERIOD_US SECONDS\n"), 2;
    pin(atoi(argv[2]));
    struct sched_param param = {.sched_priority = atoi(argv[3])};
    if (sched_setscheduler(0, SCHED_FIFO, &param) < 0) die("SCHED_FIFO");
    uint64_t slice = strtoull(argv[4], NULL, 10) * 1000, period = strtoull(argv[5], NULL, 10) * 1000;
    uint64_t start = now_ns(), stop = start + strtoull(argv[6], NULL, 10) * 1000000000ull;
    for (uint64_t next = start; next < stop; next += period) {
        while (now_ns() < next) {
            struct timespec rest = {0, (long)(next - now_ns())};
            nanosleep(&rest, NULL);
        }
        while (now_ns() < next + slice) {}
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "run")) return run(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "hog")) return hog(argc, argv);
    fprintf(stderr, "usage: rtvb-vmm run|hog ...\n");
    return 2;
}
