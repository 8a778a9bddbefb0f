/* virtio-console devices, on the arch's transport (x86_64/virtio_pci.c: legacy virtio-pci on PCI bus 0;
 * aarch64/virtio_mmio.c: virtio-mmio from the device tree). A device that offers the multiport feature (QEMU's
 * max_ports > 1) is driven through port 1, a `virtserialport`: while its chardev takes no more, QEMU holds our
 * buffer until it does. Without multiport, port 0 (a `virtconsole`) is reached through queues 0 and 1; QEMU drops
 * what its chardev refuses there (a full pty or pipe), so the stream is only whole while the host keeps up. Each
 * write hands the host one buffer of up to a ring chunk, so the host writes whole chunks to its chardev where a
 * UART hands it single bytes.
 *
 * The first console carries the sample stream; a second one, which the host adds to an explained run, the clock
 * exchange (clocksync.c). Both are driven by polling: the guest enables no device interrupt. */
#include "kernel.h"

/* queue pairs, receive then transmit: port 0's, then (multiport) the control pair, then port 1's */
enum { RECEIVE_QUEUE = 0, CONTROL_RECEIVE_QUEUE = 2, CONTROL_TRANSMIT_QUEUE = 3, PORT1_RECEIVE_QUEUE = 4,
       MAX_QUEUE = 256, DESC_DEVICE_WRITES = 2, MAX_CONSOLES = 2 };
enum { F_MULTIPORT = 1u << 1 }; /* VIRTIO_CONSOLE_F_MULTIPORT */
/* control events (virtio 5.3.6.2); the port we use */
enum { DEVICE_READY = 0, PORT_READY = 3, PORT_OPEN = 6, OUR_PORT = 1, CONTROL_BUFFERS = 8 };
enum { PORT_OPEN_WAIT_NS = 10000000000ull }; /* the host's side opens with QEMU or before the guest runs */
/* the legacy layout (which the modern one also takes): descriptors, the available ring, then the used ring on
 * the next 4 KiB boundary */
enum { VRING_BYTES = 2 * 4096 + MAX_QUEUE * (16 + 2 + 8) + 4096 };

struct control_message {
    uint32_t id;
    uint16_t event, value;
};

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
    volatile struct desc *descs;
    volatile uint16_t *avail; /* flags, idx, ring[size] */
    volatile uint16_t *used_idx;
    volatile struct used_elem *used;
} vqueue;

struct vconsole {
    virtio_transport *device;
    vqueue transmit, receive, control_transmit, control_receive;
    uint16_t control_seen; /* control messages read so far (the control receive queue's used index) */
    _Alignas(4096) uint8_t transmit_ring[VRING_BYTES], receive_ring[VRING_BYTES];
    _Alignas(4096) uint8_t control_transmit_ring[VRING_BYTES], control_receive_ring[VRING_BYTES];
    uint8_t received[64]; /* the receive queue's buffer: the host's lines are short */
    struct control_message sent, control[CONTROL_BUFFERS][4]; /* a PORT_NAME message carries a name: cut */
};

static struct vconsole consoles[MAX_CONSOLES];

static bool queue_setup(vconsole *c, vqueue *q, uint16_t index, uint8_t *memory) {
    uint16_t size = virtio_queue_size(c->device, index);
    if (!size) return false;
    if (size > MAX_QUEUE) size = MAX_QUEUE; /* a transport that lets us choose takes ours */
    q->index = index;
    q->size = size;
    q->descs = (volatile struct desc *)memory;
    q->avail = (volatile uint16_t *)(memory + 16u * size);
    size_t used_offset = (16u * size + 6u + 2u * size + 4095u) & ~4095u;
    q->used_idx = (volatile uint16_t *)(memory + used_offset + 2);
    q->used = (volatile struct used_elem *)(memory + used_offset + 4);
    return virtio_queue_place(c->device, index, memory, size);
}

static void describe(vqueue *q, uint16_t id, const void *p, size_t n, uint16_t flags) {
    q->descs[id].addr = (uint64_t)(uintptr_t)p;
    q->descs[id].len = (uint32_t)n;
    q->descs[id].flags = flags;
    q->descs[id].next = 0;
}

/* Offer the host descriptor `id` (already described). */
static void offer(vconsole *c, vqueue *q, uint16_t id) {
    q->avail[2 + q->posted % q->size] = id;
    wmb(); /* the descriptor and the ring entry before the index that offers them */
    q->avail[1] = ++q->posted;
    wmb();
    virtio_notify(c->device, q->index);
}

/* Hand the host one buffer (to read, or with DESC_DEVICE_WRITES to fill); it is done with it once
 * *used_idx reaches q->posted. */
static void queue_post(vconsole *c, vqueue *q, const void *p, size_t n, uint16_t flags) {
    describe(q, 0, p, n, flags);
    offer(c, q, 0);
}

/* Hand the host one buffer to read and wait until it has taken it (the caller reuses the memory next). */
static void queue_send(vconsole *c, vqueue *q, const void *p, size_t n) {
    queue_post(c, q, p, n, 0);
    while (*q->used_idx != q->posted) cpu_relax();
    rmb();
}

/* One control message to the device. */
static void control_send(vconsole *c, uint32_t id, uint16_t event, uint16_t value) {
    c->sent = (struct control_message){id, event, value};
    queue_send(c, &c->control_transmit, &c->sent, sizeof c->sent);
}

/* Whether the device has said, by `deadline`, that the host's side of our port is open (QEMU discards what
 * a port is sent until then). Every control buffer is offered at once, and offered again once read: QEMU
 * drops a control message that finds none (PORT_ADD, PORT_NAME and PORT_OPEN come together). */
static bool host_opened(vconsole *c, uint64_t deadline) {
    vqueue *q = &c->control_receive;
    while (cycles() < deadline) {
        if (*q->used_idx == c->control_seen) {
            cpu_relax();
            continue;
        }
        rmb(); /* the used entry and the message after the index that announced them */
        uint32_t slot = q->used[c->control_seen % q->size].id;
        struct control_message m = c->control[slot % CONTROL_BUFFERS][0];
        c->control_seen++;
        offer(c, q, (uint16_t)slot);
        if (m.id == OUR_PORT && m.event == PORT_OPEN && m.value) return true; /* (0: closed again; wait on) */
    }
    return false;
}

/* The multiport handshake for our port: the driver is ready, the port is ready and open on our side; then the
 * host's word that its side is open. */
static bool open_port(vconsole *c) {
    vqueue *q = &c->control_receive;
    for (uint16_t i = 0; i < CONTROL_BUFFERS && i < q->size; i++) {
        describe(q, i, c->control[i], sizeof c->control[i], DESC_DEVICE_WRITES);
        offer(c, q, i);
    }
    control_send(c, UINT32_MAX, DEVICE_READY, 1);
    control_send(c, OUR_PORT, PORT_READY, 1);
    control_send(c, OUR_PORT, PORT_OPEN, 1);
    return host_opened(c, cycles() + ns_to_cycles(PORT_OPEN_WAIT_NS));
}

vconsole *vconsole_open(unsigned index) {
    if (index >= MAX_CONSOLES) return NULL;
    vconsole *c = &consoles[index];
    if (c->device) return c;
    virtio_transport *device = virtio_console_find(index);
    if (!device) return NULL;
    c->device = device;
    bool multiport = virtio_reset_and_ack(device, F_MULTIPORT) & F_MULTIPORT;
    uint16_t port_queues = multiport ? PORT1_RECEIVE_QUEUE : RECEIVE_QUEUE; /* its receive queue, then transmit */
    if (!queue_setup(c, &c->receive, port_queues, c->receive_ring) ||
        !queue_setup(c, &c->transmit, port_queues + 1, c->transmit_ring) ||
        (multiport && (!queue_setup(c, &c->control_receive, CONTROL_RECEIVE_QUEUE, c->control_receive_ring) ||
                       !queue_setup(c, &c->control_transmit, CONTROL_TRANSMIT_QUEUE, c->control_transmit_ring)))) {
        c->device = NULL;
        return NULL;
    }
    virtio_driver_ok(device);
    queue_post(c, &c->receive, c->received, sizeof c->received, DESC_DEVICE_WRITES); /* the host's lines wait */
    if (multiport && !open_port(c))
        run_error("virtio-console: the host did not open port 1 of its multiport device within 10 s (QEMU "
                  "discards what a port is sent until its chardev is connected)");
    /* QEMU ignores a receive queue's notification while the port is not open on our side, and reads the host's
     * socket only once told the port can take data: notify again now that it is open */
    if (multiport) virtio_notify(device, c->receive.index);
    return c;
}

void vconsole_write(vconsole *c, const uint8_t *p, size_t n) { queue_send(c, &c->transmit, p, n); }

/* One line the host wrote to the console (without its newline), waited for until `deadline` (counter); false
 * when none came complete by then (line holds what did). What follows the newline in the same buffer is lost:
 * the host writes one line and waits for our answer. */
bool vconsole_read_line(vconsole *c, char *line, size_t size, uint64_t deadline) {
    size_t kept = 0;
    line[0] = 0;
    while (cycles() < deadline) {
        if (*c->receive.used_idx != c->receive.posted) {
            cpu_relax();
            continue;
        }
        rmb(); /* the used entry and the bytes after the index that announced them */
        uint32_t n = c->receive.used[(uint16_t)(c->receive.posted - 1) % c->receive.size].len;
        bool complete = false;
        for (uint32_t i = 0; i < n && i < sizeof c->received && !complete; i++) {
            if (c->received[i] == '\n') complete = true;
            else if (kept + 1 < size) line[kept++] = (char)c->received[i];
        }
        line[kept] = 0;
        queue_post(c, &c->receive, c->received, sizeof c->received, DESC_DEVICE_WRITES);
        if (complete) return true;
    }
    return false;
}
