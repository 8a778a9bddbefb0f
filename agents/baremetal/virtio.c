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
enum { RECEIVE_QUEUE = 0, TRANSMIT_QUEUE = 1, MAX_QUEUE = 256, DESC_DEVICE_WRITES = 2 };

struct desc {
    uint64_t addr;
    uint32_t len;
    uint16_t flags, next;
};
struct used_elem {
    uint32_t id, len;
};

/* one virtqueue with a single buffer in flight: handed over, then taken back once the host marks it used */
typedef struct {
    uint16_t index, size, posted;
    struct desc *descs;
    volatile uint16_t *avail; /* flags, idx, ring[size] */
    volatile uint16_t *used_idx;
    volatile struct used_elem *used;
} vqueue;

static uint16_t io_base;
static vqueue transmit, receive;
/* the legacy layout: descriptors, available ring, then the used ring on the next 4 KiB boundary */
enum { VRING_BYTES = 2 * 4096 + MAX_QUEUE * (16 + 2 + 8) + 4096 };
static _Alignas(4096) uint8_t transmit_ring[VRING_BYTES], receive_ring[VRING_BYTES];
static uint8_t received[64]; /* the receive queue's buffer: the host's end-of-stream confirmation is one line */

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

static bool queue_setup(vqueue *q, uint16_t index, uint8_t *memory) {
    outw(io_base + VP_QUEUE_SELECT, index);
    q->index = index;
    q->size = inw(io_base + VP_QUEUE_SIZE);
    if (!q->size || q->size > MAX_QUEUE) return false;
    q->descs = (struct desc *)memory;
    q->avail = (volatile uint16_t *)(memory + 16u * q->size);
    size_t used_offset = (16u * q->size + 6u + 2u * q->size + 4095u) & ~4095u;
    q->used_idx = (volatile uint16_t *)(memory + used_offset + 2);
    q->used = (volatile struct used_elem *)(memory + used_offset + 4);
    outl(io_base + VP_QUEUE_PFN, (uint32_t)((uintptr_t)memory >> 12));
    return true;
}

/* Hand the host one buffer (to read, or with DESC_DEVICE_WRITES to fill); it is done with it once
 * *used_idx reaches q->posted. */
static void queue_post(vqueue *q, const void *p, size_t n, uint16_t flags) {
    q->descs[0] = (struct desc){.addr = (uint64_t)(uintptr_t)p, .len = (uint32_t)n, .flags = flags};
    q->avail[2 + q->posted % q->size] = 0;
    barrier();
    q->avail[1] = ++q->posted;
    barrier();
    outw(io_base + VP_QUEUE_NOTIFY, q->index);
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
    if (!queue_setup(&receive, RECEIVE_QUEUE, receive_ring) || !queue_setup(&transmit, TRANSMIT_QUEUE, transmit_ring)) {
        io_base = 0;
        return false;
    }
    outb(io_base + VP_STATUS, STATUS_ACK | STATUS_DRIVER | STATUS_DRIVER_OK);
    queue_post(&receive, received, sizeof received, DESC_DEVICE_WRITES); /* what the host sends waits there */
    return true;
}

/* Hand the host one buffer and wait until it has taken it (the caller reuses the memory next). */
void virtio_console_write(const uint8_t *p, size_t n) {
    queue_post(&transmit, p, n, 0);
    while (*transmit.used_idx != transmit.posted) __asm__ volatile("pause");
}

/* One line the host wrote to the console (without its newline), waited for until deadline_tsc; false when
 * none came complete by then (line holds what did). */
bool virtio_console_read_line(char *line, size_t size, uint64_t deadline_tsc) {
    size_t kept = 0;
    line[0] = 0;
    while (io_base && rdtsc() < deadline_tsc) {
        if (*receive.used_idx != receive.posted) {
            __asm__ volatile("pause");
            continue;
        }
        uint32_t n = receive.used[(uint16_t)(receive.posted - 1) % receive.size].len;
        for (uint32_t i = 0; i < n && i < sizeof received; i++) {
            if (received[i] == '\n') {
                line[kept] = 0;
                return true;
            }
            if (kept + 1 < size) line[kept++] = (char)received[i];
        }
        line[kept] = 0;
        queue_post(&receive, received, sizeof received, DESC_DEVICE_WRITES);
    }
    return false;
}
