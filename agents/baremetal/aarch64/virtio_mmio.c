/* virtio's MMIO transport (legacy version 1, which QEMU's virt machine offers by default, and version 2), the
 * devices named by the device tree's virtio,mmio nodes. QEMU puts the first -device on the command line at the
 * highest transport address and lists the transports lowest first: we count consoles from the highest address
 * down, so the stream's console (given first) is console 0 and the clock exchange's console 1. Written from the
 * virtio specification (4.2 "Virtio Over MMIO"). */
#include "kernel.h"

enum { MAGIC = 0x000, VERSION = 0x004, DEVICE_ID = 0x008, DEVICE_FEATURES = 0x010, DEVICE_FEATURES_SEL = 0x014,
       DRIVER_FEATURES = 0x020, DRIVER_FEATURES_SEL = 0x024, GUEST_PAGE_SIZE = 0x028, QUEUE_SEL = 0x030,
       QUEUE_NUM_MAX = 0x034, QUEUE_NUM = 0x038, QUEUE_ALIGN = 0x03c, QUEUE_PFN = 0x040, QUEUE_READY = 0x044,
       QUEUE_NOTIFY = 0x050, STATUS = 0x070, QUEUE_DESC = 0x080, QUEUE_DRIVER = 0x090, QUEUE_DEVICE = 0x0a0 };
enum { VIRTIO_MAGIC = 0x74726976, CONSOLE_ID = 3, STATUS_ACK = 1, STATUS_DRIVER = 2, STATUS_DRIVER_OK = 4,
       STATUS_FEATURES_OK = 8, VERSION_1_FEATURE_WORD = 1 /* bit 32: VIRTIO_F_VERSION_1 */ };

struct virtio_transport {
    uintptr_t base;
    uint32_t version;
};
static virtio_transport devices[2];

static uint32_t reg(virtio_transport *t, unsigned offset) { return mmio_read32(t->base + offset); }
static void set(virtio_transport *t, unsigned offset, uint32_t v) { mmio_write32(t->base + offset, v); }

virtio_transport *virtio_console_find(unsigned index) {
    if (index >= sizeof devices / sizeof devices[0]) return NULL;
    /* highest address first: QEMU's command-line order */
    bool used[MAX_VIRTIO_MMIO] = {0};
    unsigned seen = 0;
    for (unsigned round = 0; round < platform.nvirtio; round++) {
        int best = -1;
        for (unsigned i = 0; i < platform.nvirtio; i++)
            if (!used[i] && (best < 0 || platform.virtio[i].base > platform.virtio[best].base)) best = (int)i;
        used[best] = true;
        uintptr_t base = platform.virtio[best].base;
        if (mmio_read32(base + MAGIC) != VIRTIO_MAGIC || mmio_read32(base + DEVICE_ID) != CONSOLE_ID) continue;
        uint32_t version = mmio_read32(base + VERSION);
        if (version != 1 && version != 2) continue;
        if (seen++ != index) continue;
        devices[index] = (virtio_transport){base, version};
        return &devices[index];
    }
    return NULL;
}

/* Reset, then ACKNOWLEDGE | DRIVER and of the first feature word those wanted, with VERSION_1 (which a modern
 * device requires) */
uint32_t virtio_reset_and_ack(virtio_transport *t, uint32_t wanted) {
    set(t, STATUS, 0);
    set(t, STATUS, STATUS_ACK | STATUS_DRIVER);
    set(t, DEVICE_FEATURES_SEL, 0);
    uint32_t accepted = reg(t, DEVICE_FEATURES) & wanted;
    set(t, DRIVER_FEATURES_SEL, 0);
    set(t, DRIVER_FEATURES, accepted);
    if (t->version == 2) {
        set(t, DRIVER_FEATURES_SEL, 1);
        set(t, DRIVER_FEATURES, VERSION_1_FEATURE_WORD);
        set(t, STATUS, STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK);
    } else {
        set(t, GUEST_PAGE_SIZE, 4096);
    }
    return accepted;
}

uint16_t virtio_queue_size(virtio_transport *t, uint16_t queue) {
    set(t, QUEUE_SEL, queue);
    uint32_t max = reg(t, QUEUE_NUM_MAX);
    return max > 0xffff ? 0xffff : (uint16_t)max;
}

bool virtio_queue_place(virtio_transport *t, uint16_t queue, uint8_t *memory, uint16_t size) {
    set(t, QUEUE_SEL, queue);
    set(t, QUEUE_NUM, size);
    uint64_t desc = (uint64_t)(uintptr_t)memory, avail = desc + 16u * size,
             used = desc + ((16u * size + 6u + 2u * size + 4095u) & ~4095u);
    if (t->version == 1) {
        set(t, QUEUE_ALIGN, 4096);
        set(t, QUEUE_PFN, (uint32_t)(desc >> 12));
        return true;
    }
    set(t, QUEUE_DESC, (uint32_t)desc);
    set(t, QUEUE_DESC + 4, (uint32_t)(desc >> 32));
    set(t, QUEUE_DRIVER, (uint32_t)avail);
    set(t, QUEUE_DRIVER + 4, (uint32_t)(avail >> 32));
    set(t, QUEUE_DEVICE, (uint32_t)used);
    set(t, QUEUE_DEVICE + 4, (uint32_t)(used >> 32));
    set(t, QUEUE_READY, 1);
    return true;
}

void virtio_driver_ok(virtio_transport *t) {
    uint32_t features_ok = t->version == 2 ? STATUS_FEATURES_OK : 0;
    set(t, STATUS, STATUS_ACK | STATUS_DRIVER | features_ok | STATUS_DRIVER_OK);
}

void virtio_notify(virtio_transport *t, uint16_t queue) {
    __asm__ volatile("dsb st" ::: "memory"); /* the ring's stores reach memory before the device looks */
    set(t, QUEUE_NOTIFY, queue);
}
