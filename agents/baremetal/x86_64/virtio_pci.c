/* virtio's legacy PCI transport, as QEMU's transitional virtio-serial-pci offers it: the devices are found by
 * scanning bus 0's configuration space through ports 0xCF8/0xCFC, in slot order (QEMU gives -device options
 * slots in command-line order: the stream's console first, the clock exchange's second), and driven through
 * their I/O BAR. A modern-only device (no I/O BAR) is not ours to drive. */
#include "kernel.h"

enum { PCI_ADDR = 0xCF8, PCI_DATA = 0xCFC, VIRTIO_VENDOR = 0x1AF4, VIRTIO_CONSOLE_LEGACY = 0x1003 };
/* legacy virtio-pci I/O registers */
enum { VP_HOST_FEATURES = 0, VP_GUEST_FEATURES = 4, VP_QUEUE_PFN = 8, VP_QUEUE_SIZE = 12, VP_QUEUE_SELECT = 14,
       VP_QUEUE_NOTIFY = 16, VP_STATUS = 18 };
enum { STATUS_ACK = 1, STATUS_DRIVER = 2, STATUS_DRIVER_OK = 4 };

struct virtio_transport {
    uint16_t io_base;
};
static virtio_transport devices[2];

static uint32_t pci_read(unsigned bus, unsigned dev, unsigned fn, unsigned reg) {
    outl(PCI_ADDR, 0x80000000u | bus << 16 | dev << 11 | fn << 8 | (reg & 0xFC));
    return inl(PCI_DATA);
}
static void pci_write(unsigned bus, unsigned dev, unsigned fn, unsigned reg, uint32_t v) {
    outl(PCI_ADDR, 0x80000000u | bus << 16 | dev << 11 | fn << 8 | (reg & 0xFC));
    outl(PCI_DATA, v);
}

virtio_transport *virtio_console_find(unsigned index) {
    unsigned seen = 0;
    for (unsigned dev = 0; dev < 32 && index < sizeof devices / sizeof devices[0]; dev++) {
        uint32_t id = pci_read(0, dev, 0, 0);
        if ((id & 0xFFFF) != VIRTIO_VENDOR || (id >> 16) != VIRTIO_CONSOLE_LEGACY) continue;
        uint32_t bar0 = pci_read(0, dev, 0, 0x10);
        if (!(bar0 & 1)) continue; /* not an I/O BAR: a modern-only device, which we do not drive */
        if (seen++ != index) continue;
        pci_write(0, dev, 0, 0x04, pci_read(0, dev, 0, 0x04) | 0x5); /* I/O space and bus mastering */
        devices[index].io_base = (uint16_t)(bar0 & ~3u);
        return &devices[index];
    }
    return NULL;
}

uint32_t virtio_reset_and_ack(virtio_transport *t, uint32_t wanted) {
    outb(t->io_base + VP_STATUS, 0);
    outb(t->io_base + VP_STATUS, STATUS_ACK | STATUS_DRIVER);
    uint32_t accepted = inl(t->io_base + VP_HOST_FEATURES) & wanted;
    outl(t->io_base + VP_GUEST_FEATURES, accepted);
    return accepted;
}

uint16_t virtio_queue_size(virtio_transport *t, uint16_t queue) {
    outw(t->io_base + VP_QUEUE_SELECT, queue);
    return inw(t->io_base + VP_QUEUE_SIZE);
}

/* Legacy: the device's own size only, the ring in one place given by its page frame number. */
bool virtio_queue_place(virtio_transport *t, uint16_t queue, uint8_t *memory, uint16_t size) {
    outw(t->io_base + VP_QUEUE_SELECT, queue);
    if (inw(t->io_base + VP_QUEUE_SIZE) != size) return false;
    outl(t->io_base + VP_QUEUE_PFN, (uint32_t)((uintptr_t)memory >> 12));
    return true;
}

void virtio_driver_ok(virtio_transport *t) {
    outb(t->io_base + VP_STATUS, STATUS_ACK | STATUS_DRIVER | STATUS_DRIVER_OK);
}

void virtio_notify(virtio_transport *t, uint16_t queue) { outw(t->io_base + VP_QUEUE_NOTIFY, queue); }
