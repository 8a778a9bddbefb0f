/* virtio-console (legacy virtio-pci, as QEMU's transitional virtio-serial-pci offers it on a PCI bus):
 * the stream channel when present. Without the multiport feature port 0 (a `virtconsole`) is
 * reached through queues 0 (receive) and 1 (transmit); each write hands the host one buffer of up to
 * a ring chunk, so the host writes whole chunks to its chardev where the debug console and a UART
 * hand it single bytes. Found by scanning PCI configuration space through ports 0xCF8/0xCFC. */
#include "kernel.h"

enum { PCI_ADDR = 0xCF8, PCI_DATA = 0xCFC, VIRTIO_VENDOR = 0x1AF4, VIRTIO_CONSOLE_LEGACY = 0x1003 };
/* legacy virtio-pci I/O registers */
enum { VP_GUEST_FEATURES = 4, VP_QUEUE_PFN = 8, VP_QUEUE_SIZE = 12, VP_QUEUE_SELECT = 14, VP_QUEUE_NOTIFY = 16,
       VP_STATUS = 18 };
enum { STATUS_ACK = 1, STATUS_DRIVER = 2, STATUS_DRIVER_OK = 4 };
enum { TRANSMIT_QUEUE = 1, MAX_QUEUE = 256 };

struct desc {
    uint64_t addr;
    uint32_t len;
    uint16_t flags, next;
};
struct used_elem {
    uint32_t id, len;
};

static uint16_t io_base, qsize;
static struct desc *descs;
static volatile uint16_t *avail; /* flags, idx, ring[qsize] */
static volatile uint16_t *used_idx;
static uint16_t sent;
/* the legacy layout: descriptors, available ring, then the used ring on the next 4 KiB boundary */
static _Alignas(4096) uint8_t vring[2 * 4096 + MAX_QUEUE * (16 + 2 + 8) + 4096];

static inline void outw(uint16_t port, uint16_t v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint16_t inw(uint16_t port) {
    uint16_t v;
    __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline uint32_t inl(uint16_t port) {
    uint32_t v;
    __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static uint32_t pci_read(unsigned bus, unsigned dev, unsigned fn, unsigned reg) {
    outl(PCI_ADDR, 0x80000000u | bus << 16 | dev << 11 | fn << 8 | (reg & 0xFC));
    return inl(PCI_DATA);
}
static void pci_write(unsigned bus, unsigned dev, unsigned fn, unsigned reg, uint32_t v) {
    outl(PCI_ADDR, 0x80000000u | bus << 16 | dev << 11 | fn << 8 | (reg & 0xFC));
    outl(PCI_DATA, v);
}

bool virtio_console_init(void) {
    for (unsigned dev = 0; dev < 32 && !io_base; dev++) {
        uint32_t id = pci_read(0, dev, 0, 0);
        if ((id & 0xFFFF) != VIRTIO_VENDOR || (id >> 16) != VIRTIO_CONSOLE_LEGACY) continue;
        uint32_t bar0 = pci_read(0, dev, 0, 0x10);
        if (!(bar0 & 1)) continue; /* not an I/O BAR: a modern-only device, which we do not drive */
        pci_write(0, dev, 0, 0x04, pci_read(0, dev, 0, 0x04) | 0x5); /* I/O space and bus mastering */
        io_base = (uint16_t)(bar0 & ~3u);
    }
    if (!io_base) return false;
    outb(io_base + VP_STATUS, 0);
    outb(io_base + VP_STATUS, STATUS_ACK | STATUS_DRIVER);
    outl(io_base + VP_GUEST_FEATURES, 0); /* no multiport: port 0 is the console */
    outw(io_base + VP_QUEUE_SELECT, TRANSMIT_QUEUE);
    qsize = inw(io_base + VP_QUEUE_SIZE);
    if (!qsize || qsize > MAX_QUEUE) {
        io_base = 0;
        return false;
    }
    descs = (struct desc *)vring;
    avail = (volatile uint16_t *)(vring + 16u * qsize);
    size_t used_offset = (16u * qsize + 6u + 2u * qsize + 4095u) & ~4095u;
    used_idx = (volatile uint16_t *)(vring + used_offset + 2);
    outl(io_base + VP_QUEUE_PFN, (uint32_t)((uintptr_t)vring >> 12));
    outb(io_base + VP_STATUS, STATUS_ACK | STATUS_DRIVER | STATUS_DRIVER_OK);
    return true;
}

/* Hand the host one buffer and wait until it has taken it (the caller reuses the memory next). */
void virtio_console_write(const uint8_t *p, size_t n) {
    descs[0] = (struct desc){.addr = (uint64_t)(uintptr_t)p, .len = (uint32_t)n};
    avail[2 + sent % qsize] = 0;
    barrier();
    avail[1] = ++sent;
    barrier();
    outw(io_base + VP_QUEUE_NOTIFY, TRANSMIT_QUEUE);
    while (*used_idx != sent) __asm__ volatile("pause");
}
