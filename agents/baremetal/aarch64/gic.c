/* aarch64 interrupts: the GIC (v2: distributor and CPU interface in MMIO; v3: distributor and redistributor in
 * MMIO, the CPU interface in system registers), the generic timer's virtual timer (CNTV_CVAL_EL0: a deadline on
 * the virtual counter, as x86's TSC-deadline mode), SGIs to ourselves (the kops probe), the power button that
 * stops a run (QEMU's system_powerdown raises a PL061 GPIO line, as the device tree's gpio-keys node says), and
 * the exception frames (vectors.S) which are also the threads' saved states. Written from the GIC architecture
 * specification (IHI 0048, IHI 0069), the Arm ARM's generic timer chapter and the PL061 TRM. */
#include "kernel.h"

enum { KOPS_SGI = 1, PRIORITY = 0xa0, SPURIOUS = 1020 };
/* distributor */
enum { GICD_CTLR = 0x000, GICD_IGROUPR = 0x080, GICD_ISENABLER = 0x100, GICD_IPRIORITYR = 0x400,
       GICD_ITARGETSR = 0x800, GICD_ICFGR = 0xc00, GICD_SGIR = 0xf00, GICD_IROUTER = 0x6000 };
/* v2 CPU interface */
enum { GICC_CTLR = 0x00, GICC_PMR = 0x04, GICC_BPR = 0x08, GICC_IAR = 0x0c, GICC_EOIR = 0x10, GICC_HPPIR = 0x18 };
/* v3 redistributor: RD_base, then SGI_base 64 KiB above it */
enum { GICR_WAKER = 0x14, GICR_SGI = 0x10000, GICR_STRIDE = 0x20000 };
/* PL061 */
enum { GPIO_IS = 0x404, GPIO_IBE = 0x408, GPIO_IEV = 0x40c, GPIO_IE = 0x410, GPIO_IC = 0x41c };

static uint32_t power_irq; /* the PL061's SPI, when the power button is ours */
static uint64_t redistributor;

/* ---- the GIC ---- */

static void wait_rwp(uintptr_t reg) {
    for (int spins = 0; (mmio_read32(reg) & (1u << 31)) && spins < 1000000; spins++) cpu_relax();
}

/* Our CPU's redistributor: the frame whose GICR_TYPER affinity is our MPIDR's */
static uint64_t find_redistributor(void) {
    uint64_t mpidr = sysreg_read(mpidr_el1);
    uint32_t affinity = (uint32_t)((mpidr & 0xffffff) | ((mpidr >> 32) & 0xff) << 24);
    for (uint64_t rd = platform.gicr, n = 0; n < 256; rd += GICR_STRIDE, n++) {
        uint64_t typer = (uint64_t)mmio_read32(rd + 0x8) | (uint64_t)mmio_read32(rd + 0xc) << 32;
        if ((uint32_t)(typer >> 32) == affinity) return rd;
        if (typer & (1u << 4)) break; /* Last */
    }
    return platform.gicr;
}

/* An interrupt on, at our priority, to this CPU, level-triggered (SPIs; SGIs and PPIs are banked per CPU) */
static void gic_enable(uint32_t intid) {
    uintptr_t d = platform.gicd;
    bool banked = intid < 32;
    uintptr_t regs = platform.gic_version == 3 && banked ? redistributor + GICR_SGI : d;
    mmio_write8(regs + GICD_IPRIORITYR + intid, PRIORITY);
    if (platform.gic_version == 3) {
        uintptr_t group = regs + GICD_IGROUPR + 4 * (intid / 32); /* group 1 (non-secure) */
        mmio_write32(group, mmio_read32(group) | 1u << (intid % 32));
        if (!banked) {
            uint64_t mpidr = sysreg_read(mpidr_el1);
            mmio_write64(d + GICD_IROUTER + 8 * intid, (mpidr & 0xffffff) | (mpidr & 0xff00000000ull));
        }
    } else if (!banked) {
        mmio_write8(d + GICD_ITARGETSR + intid, 1); /* CPU interface 0 */
    }
    if (!banked) { /* level-sensitive (the device holds its line until we clear it) */
        uintptr_t cfg = d + GICD_ICFGR + 4 * (intid / 16);
        mmio_write32(cfg, mmio_read32(cfg) & ~(2u << 2 * (intid % 16)));
    }
    mmio_write32(regs + GICD_ISENABLER + 4 * (intid / 32), 1u << (intid % 32));
    if (platform.gic_version == 3) wait_rwp(banked ? redistributor : d);
}

static uint32_t gic_ack(void) {
    if (platform.gic_version == 3) return (uint32_t)sysreg_read(S3_0_C12_C12_0); /* ICC_IAR1_EL1 */
    return mmio_read32(platform.gicc + GICC_IAR);
}

static void gic_eoi(uint32_t iar) {
    if (platform.gic_version == 3) {
        sysreg_write(S3_0_C12_C12_1, iar); /* ICC_EOIR1_EL1 */
        isb();
    } else {
        mmio_write32(platform.gicc + GICC_EOIR, iar);
    }
}

/* the interrupt the CPU interface would deliver next, without taking it */
static uint32_t gic_pending(void) {
    if (platform.gic_version == 3) return (uint32_t)sysreg_read(S3_0_C12_C12_2) & 0xffffff; /* ICC_HPPIR1_EL1 */
    return mmio_read32(platform.gicc + GICC_HPPIR) & 0x3ff;
}

static void gic_init(void) {
    uintptr_t d = platform.gicd;
    if (platform.gic_version == 3) {
        mmio_write32(d + GICD_CTLR, (1u << 4) | (1u << 1) | 1u); /* ARE, group 1 (both views), group 0/1 */
        wait_rwp(d);
        redistributor = find_redistributor();
        uint32_t waker = mmio_read32(redistributor + GICR_WAKER);
        mmio_write32(redistributor + GICR_WAKER, waker & ~(1u << 1)); /* ProcessorSleep off */
        for (int spins = 0; (mmio_read32(redistributor + GICR_WAKER) & (1u << 2)) && spins < 1000000; spins++)
            cpu_relax();
        sysreg_write(S3_0_C12_C12_5, sysreg_read(S3_0_C12_C12_5) | 1); /* ICC_SRE_EL1.SRE */
        isb();
        sysreg_write(S3_0_C4_C6_0, 0xf0);  /* ICC_PMR_EL1 */
        sysreg_write(S3_0_C12_C12_3, 0);   /* ICC_BPR1_EL1 */
        sysreg_write(S3_0_C12_C12_4, 0);   /* ICC_CTLR_EL1: EOI drops priority and deactivates */
        sysreg_write(S3_0_C12_C12_7, 1);   /* ICC_IGRPEN1_EL1 */
        isb();
    } else {
        mmio_write32(d + GICD_CTLR, 1);
        mmio_write32(platform.gicc + GICC_PMR, 0xf0);
        mmio_write32(platform.gicc + GICC_BPR, 0);
        mmio_write32(platform.gicc + GICC_CTLR, 1);
    }
}

const char *interrupt_controller(void) { return platform.gic_version == 3 ? "gicv3" : "gicv2"; }

void kops_self_ipi(void) {
    if (platform.gic_version == 3) {
        uint64_t mpidr = sysreg_read(mpidr_el1);
        uint64_t target = 1ull << (mpidr & 15), aff1 = (mpidr >> 8) & 0xff, aff2 = (mpidr >> 16) & 0xff,
                 aff3 = (mpidr >> 32) & 0xff;
        sysreg_write(S3_0_C12_C11_5, (uint64_t)KOPS_SGI << 24 | aff1 << 16 | aff2 << 32 | aff3 << 48 | target);
        isb();
    } else {
        mmio_write32(platform.gicd + GICD_SGIR, (2u << 24) | KOPS_SGI); /* to the requesting CPU only */
    }
}

/* ---- the power button: QEMU's system_powerdown pulses a PL061 line (its gpio-keys node) ---- */

static void power_key_init(void) {
    if (!platform.has_power_key || !platform.gpio.irq) return;
    uintptr_t g = platform.gpio.base;
    uint32_t bit = 1u << platform.power_key_pin;
    mmio_write32(g + GPIO_IS, mmio_read32(g + GPIO_IS) & ~bit);  /* edge */
    mmio_write32(g + GPIO_IBE, mmio_read32(g + GPIO_IBE) & ~bit);
    mmio_write32(g + GPIO_IEV, mmio_read32(g + GPIO_IEV) | bit); /* rising: the button pressed */
    mmio_write32(g + GPIO_IC, bit);
    mmio_write32(g + GPIO_IE, mmio_read32(g + GPIO_IE) | bit);
    power_irq = platform.gpio.irq;
    gic_enable(power_irq);
}

/* Where interrupts are off (the gap probe's spin) a pressed button waits in the GIC: look (ISR_EL1 says an IRQ is
 * pending; the CPU interface says which) without taking it; interrupts on again take it (EV_STOP). */
bool arch_stop_pending(void) {
    return power_irq && (sysreg_read(isr_el1) & (1u << 7)) && gic_pending() == power_irq;
}

/* ---- the virtual timer ---- */

void timer_init(void) {
    sysreg_write(cntv_ctl_el0, 0);
    isb();
    if (!platform.timer_irq) run_error("the device tree names no generic timer (arm,armv8-timer)");
    gic_enable(platform.timer_irq);
}

const char *timer_mode(void) { return "cntv-cval"; }

void timer_arm(uint64_t deadline) {
    sysreg_write(cntv_cval_el0, deadline);
    sysreg_write(cntv_ctl_el0, 1); /* enabled, not masked */
    isb();
}

void timer_disarm(void) {
    sysreg_write(cntv_ctl_el0, 0);
    isb();
}

void interrupts_init(void) {
    if (!platform.gic_version || !platform.gicd || (platform.gic_version == 2 ? !platform.gicc : !platform.gicr))
        run_error("the device tree names no GICv2 or GICv3 (arm,cortex-a15-gic, arm,gic-400, arm,gic-v3)");
    gic_init();
    gic_enable(KOPS_SGI);
    power_key_init();
}

/* ---- exceptions and threads ---- */

enum { FRAME_X0 = 0, FRAME_X1 = 1, FRAME_X30 = 30, FRAME_ELR = 31, FRAME_SPSR = 32, FRAME_WORDS = 34 };
enum { KIND_SYNC = 0, KIND_IRQ = 1, EC_SVC64 = 0x15 };

void *thread_frame(uint8_t *top, void (*start)(void (*)(void *), void *), void (*entry)(void *), void *arg) {
    uint64_t *f = (uint64_t *)(void *)(top - FRAME_WORDS * 8); /* resuming leaves sp at top */
    memset(f, 0, FRAME_WORDS * 8);
    f[FRAME_X0] = (uint64_t)(uintptr_t)entry;
    f[FRAME_X1] = (uint64_t)(uintptr_t)arg;
    f[FRAME_ELR] = (uint64_t)(uintptr_t)start;
    f[FRAME_SPSR] = 0x5; /* EL1h, interrupts on */
    return f;
}

static void irq(void) {
    uint32_t iar = gic_ack(), intid = iar & 0xffffff;
    if (intid >= SPURIOUS) {
        kernel_event(EV_NONE);
    } else if (intid == platform.timer_irq) {
        sysreg_write(cntv_ctl_el0, 0); /* its line stays high while the deadline has passed: off until re-armed */
        gic_eoi(iar);
        kernel_event(EV_TIMER);
    } else if (intid == KOPS_SGI) {
        kernel_event(EV_KOPS);
        gic_eoi(iar);
    } else if (power_irq && intid == power_irq) {
        mmio_write32(platform.gpio.base + GPIO_IC, 1u << platform.power_key_pin);
        gic_eoi(iar);
        kernel_event(EV_STOP);
    } else {
        gic_eoi(iar);
        kernel_event(EV_NONE);
    }
}

/* From vectors.S: the event, then the frame to resume. */
void *arm_exception(uint64_t *frame, uint64_t kind) {
    if (kind == KIND_IRQ) {
        irq();
        return sched_switch(frame);
    }
    uint64_t esr = sysreg_read(esr_el1);
    if (kind == KIND_SYNC && (esr >> 26) == EC_SVC64) { /* the switch trap: ELR is already past it */
        kernel_event(EV_NONE);
        return sched_switch(frame);
    }
    cpu_exception(kind == KIND_SYNC ? "exception class" : "unexpected exception vector",
                  kind == KIND_SYNC ? esr >> 26 : kind, kind == KIND_SYNC ? esr : sysreg_read(far_el1),
                  frame[FRAME_ELR]);
}
