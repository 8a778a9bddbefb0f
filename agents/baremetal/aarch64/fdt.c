/* The flattened device tree the loader hands us in x0 (QEMU's -kernel, Xen's domain builder, our test VMM): the
 * RAM, the command line (/chosen/bootargs), and the devices the kernel drives, found by their "compatible"
 * strings. Written from the Devicetree Specification (the blob's format, standard properties) and the bindings
 * of the devices named below; reg and interrupts are read with the cells of each node's parent. Read once at
 * boot into `platform`; the blob may be overwritten afterwards (it lies in RAM the arena hands out). */
#include "kernel.h"

enum { FDT_MAGIC = 0xd00dfeed, FDT_BEGIN_NODE = 1, FDT_END_NODE = 2, FDT_PROP = 3, FDT_NOP = 4, FDT_END = 9,
       MAX_DEPTH = 16 };

platform_info platform;

static uint32_t be32(const void *p) {
    const uint8_t *b = p;
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static uint64_t cells(const uint8_t *p, uint32_t n) {
    uint64_t v = 0;
    for (uint32_t i = 0; i < n; i++) v = v << 32 | be32(p + 4 * i);
    return v;
}

/* A property of the node being read */
typedef struct {
    const char *name;
    const uint8_t *value;
    uint32_t len;
} prop;

/* One node's properties of interest, gathered while its properties go by */
typedef struct {
    const char *name;
    const uint8_t *compatible, *reg, *interrupts, *method, *device_type, *gpios, *bootargs, *stdout_path;
    uint32_t compatible_len, reg_len, interrupts_len, gpios_len, phandle;
    uint32_t address_cells, size_cells; /* its own, for its children (defaults 2 and 1) */
} node;

static bool string_in(const uint8_t *list, uint32_t len, const char *want) {
    size_t n = strlen(want);
    for (uint32_t at = 0; at < len;) {
        const char *s = (const char *)list + at;
        size_t l = strlen(s); /* the blob's strings are NUL-terminated within the property */
        if (l == n && !memcmp(s, want, n)) return true;
        at += (uint32_t)l + 1;
    }
    return false;
}

static bool compatible(const node *n, const char *want) {
    return n->compatible && string_in(n->compatible, n->compatible_len, want);
}

/* the first (base, size) of reg, with the parent's cells */
static void first_reg(const node *n, const node *parent, uint64_t *base, uint64_t *size) {
    uint32_t a = parent->address_cells, s = parent->size_cells;
    *base = *size = 0;
    if (!n->reg || n->reg_len < 4 * (a + s)) return;
    *base = cells(n->reg, a);
    *size = cells(n->reg + 4 * a, s);
}

static uint64_t reg_at(const node *n, const node *parent, unsigned index) {
    uint32_t a = parent->address_cells, s = parent->size_cells;
    if (!n->reg || n->reg_len < 4 * (a + s) * (index + 1)) return 0;
    return cells(n->reg + 4 * (a + s) * index, a);
}

/* A GIC interrupt specifier (type, number, flags) -> INTID: SPI 0 is 32, PPI 0 is 16 */
static uint32_t gic_intid(const node *n, unsigned index) {
    if (!n->interrupts || n->interrupts_len < 12 * (index + 1)) return 0;
    uint32_t type = be32(n->interrupts + 12 * index), number = be32(n->interrupts + 12 * index + 4);
    return type == 1 ? number + 16 : number + 32;
}

static void device(fdt_device *d, const node *n, const node *parent) {
    first_reg(n, parent, &d->base, &d->size);
    d->irq = gic_intid(n, 0);
}

static uint32_t pl061_phandle;
static uint32_t power_key_phandle;
static const char *stdout_node; /* /chosen/stdout-path: the console UART's node name (unit address included) */

/* What the node is to us, once all its properties are known */
static void take(const node *n, const node *parent, int depth) {
    if (depth == 1 && n->device_type && !strcmp((const char *)n->device_type, "memory") && !platform.ram_size)
        first_reg(n, parent, &platform.ram_base, &platform.ram_size);
    if (depth == 1 && !strcmp(n->name, "chosen")) {
        platform.bootargs = (char *)n->bootargs;
        if (n->stdout_path) {
            const char *path = (const char *)n->stdout_path, *last = path;
            for (const char *c = path; *c && *c != ':'; c++)
                if (*c == '/') last = c + 1;
            stdout_node = last;
        }
    }
    if (compatible(n, "arm,pl011") || compatible(n, "arm,sbsa-uart")) {
        /* the one stdout-path names, else the first */
        bool named = stdout_node && !strncmp(n->name, stdout_node, strlen(n->name));
        if (!platform.uart.base || named) device(&platform.uart, n, parent);
    }
    if (compatible(n, "arm,pl031") && !platform.rtc.base) device(&platform.rtc, n, parent);
    if (compatible(n, "arm,pl061") && !platform.gpio.base) {
        device(&platform.gpio, n, parent);
        pl061_phandle = n->phandle;
    }
    if (n->gpios && n->gpios_len >= 12 && compatible(parent, "gpio-keys") && !platform.has_power_key) {
        power_key_phandle = be32(n->gpios);
        platform.power_key_pin = be32(n->gpios + 4);
        platform.has_power_key = true;
    }
    if (compatible(n, "virtio,mmio") && platform.nvirtio < MAX_VIRTIO_MMIO)
        device(&platform.virtio[platform.nvirtio++], n, parent);
    if (compatible(n, "arm,gic-v3")) {
        platform.gic_version = 3;
        platform.gicd = reg_at(n, parent, 0);
        platform.gicr = reg_at(n, parent, 1);
    } else if (compatible(n, "arm,cortex-a15-gic") || compatible(n, "arm,gic-400") || compatible(n, "arm,cortex-a9-gic")) {
        platform.gic_version = 2;
        platform.gicd = reg_at(n, parent, 0);
        platform.gicc = reg_at(n, parent, 1);
    }
    if (compatible(n, "arm,armv8-timer") || compatible(n, "arm,armv7-timer"))
        platform.timer_irq = gic_intid(n, 2); /* secure, non-secure physical, virtual, hypervisor */
    if (compatible(n, "arm,psci-0.2") || compatible(n, "arm,psci-1.0") || compatible(n, "arm,psci")) {
        platform.has_psci = true;
        platform.psci_hvc = n->method && !strcmp((const char *)n->method, "hvc");
    }
    if (compatible(n, "xen,xen")) platform.xen = true;
}

static void gather(node *n, const prop *p) {
    const char *name = p->name;
    if (!strcmp(name, "compatible")) { n->compatible = p->value; n->compatible_len = p->len; }
    else if (!strcmp(name, "reg")) { n->reg = p->value; n->reg_len = p->len; }
    else if (!strcmp(name, "interrupts")) { n->interrupts = p->value; n->interrupts_len = p->len; }
    else if (!strcmp(name, "method")) n->method = p->value;
    else if (!strcmp(name, "device_type")) n->device_type = p->value;
    else if (!strcmp(name, "gpios")) { n->gpios = p->value; n->gpios_len = p->len; }
    else if (!strcmp(name, "bootargs")) n->bootargs = p->value;
    else if (!strcmp(name, "stdout-path")) n->stdout_path = p->value;
    else if (!strcmp(name, "#address-cells") && p->len == 4) n->address_cells = be32(p->value);
    else if (!strcmp(name, "#size-cells") && p->len == 4) n->size_cells = be32(p->value);
    else if ((!strcmp(name, "phandle") || !strcmp(name, "linux,phandle")) && p->len == 4) n->phandle = be32(p->value);
}

/* Walk the structure block: a node is taken when its first child begins or it ends (its properties come
 * before its children), with its parent's cells at hand. */
void fdt_scan(const void *dtb) {
    const uint8_t *blob = dtb;
    if (!blob || be32(blob) != FDT_MAGIC) return; /* kernel_main stops: no console, no memory known */
    uint32_t total = be32(blob + 4), structs = be32(blob + 8), strings = be32(blob + 12);
    platform.dtb = (uint64_t)(uintptr_t)dtb;
    platform.dtb_size = total;
    static node stack[MAX_DEPTH];
    static bool taken[MAX_DEPTH];
    int depth = -1;
    const uint8_t *p = blob + structs, *end = blob + total;
    while (p + 4 <= end) {
        uint32_t token = be32(p);
        p += 4;
        if (token == FDT_BEGIN_NODE) {
            const char *name = (const char *)p;
            p += (strlen(name) + 4) & ~3u;
            if (depth >= 0 && !taken[depth]) {
                take(&stack[depth], depth ? &stack[depth - 1] : &stack[depth], depth);
                taken[depth] = true;
            }
            if (++depth >= MAX_DEPTH) return;
            stack[depth] = (node){.name = name, .address_cells = 2, .size_cells = 1};
            taken[depth] = false;
        } else if (token == FDT_END_NODE) {
            if (depth < 0) return;
            if (!taken[depth]) take(&stack[depth], depth ? &stack[depth - 1] : &stack[depth], depth);
            depth--;
        } else if (token == FDT_PROP) {
            if (depth < 0 || p + 8 > end) return;
            prop pr = {(const char *)blob + strings + be32(p + 4), p + 8, be32(p)};
            p += 8 + ((pr.len + 3) & ~3u);
            gather(&stack[depth], &pr);
        } else if (token == FDT_END) {
            break;
        } else if (token != FDT_NOP) {
            return;
        }
    }
    if (platform.has_power_key && (!platform.gpio.base || power_key_phandle != pl061_phandle))
        platform.has_power_key = false; /* a power key on another controller: not ours to drive */
}
