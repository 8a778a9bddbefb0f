/* KVM's paravirtual features on x86, found by its CPUID leaves (signature "KVMKVMKVM" at 0x40000000, the feature
 * bits at 0x40000001). Written from the ABI in the Linux kernel's documentation (virt/kvm/x86/msr.rst, cpuid.rst).
 *
 * Steal time (KVM_FEATURE_STEAL_TIME, bit 5): enabled by writing the area's address to MSR_KVM_STEAL_TIME. KVM
 * writes there, each time it loads the vCPU onto a CPU again, the ns its thread has waited runnable on the host's
 * run queue (its scheduler's run delay) since the area was enabled: time the host took from the guest.
 *
 * kvmclock (KVM_FEATURE_CLOCKSOURCE2, bit 3): the scale KVM gives its guests to turn TSC cycles into ns is the
 * TSC's rate as the host knows it, which spares the PIT calibration. */
#include "kernel.h"

enum { MSR_KVM_SYSTEM_TIME_NEW = 0x4b564d01, MSR_KVM_STEAL_TIME = 0x4b564d03, KVM_FEATURE_CLOCKSOURCE2 = 3,
       KVM_FEATURE_STEAL_TIME = 5, MSR_ENABLE = 1 };

struct kvm_steal_time {
    uint64_t steal;   /* ns */
    uint32_t version; /* odd while KVM updates the area */
    uint32_t flags;
    uint8_t preempted;
    uint8_t pad[3];
    uint32_t reserved[11];
};
_Static_assert(sizeof(struct kvm_steal_time) == 64, "KVM's layout");

static _Alignas(64) volatile struct kvm_steal_time steal_area;

struct pvclock_vcpu_time_info {
    uint32_t version, pad0;
    uint64_t tsc_timestamp, system_time;
    uint32_t tsc_to_system_mul; /* ns = ((cycles << shift) * mul) >> 32, with a negative shift to the right */
    int8_t tsc_shift;
    uint8_t flags, pad[2];
};
_Static_assert(sizeof(struct pvclock_vcpu_time_info) == 32, "KVM's layout");
static _Alignas(32) volatile struct pvclock_vcpu_time_info time_info;

static bool kvm_feature(unsigned bit) {
    uint32_t r[4];
    for (uint32_t base = 0x40000000; base <= 0x40010000; base += 0x100) {
        cpuid(base, 0, r);
        if (r[1] != 0x4b4d564b || r[2] != 0x564b4d56 || r[3] != 0x4d) continue; /* "KVMKVMKVM\0\0\0" */
        if (r[0] < base + 1 && r[0] != 0) return false;
        cpuid(base + 1, 0, r);
        return (r[0] >> bit) & 1;
    }
    return false;
}

bool pv_steal_init(const char **source) {
    if (!kvm_feature(KVM_FEATURE_STEAL_TIME)) return false;
    wrmsr(MSR_KVM_STEAL_TIME, (uint64_t)(uintptr_t)&steal_area | MSR_ENABLE);
    *source = "kvm-steal-time";
    return true;
}

/* One consistent reading: the version even and the same before and after the copy. */
uint64_t pv_steal_ns(void) {
    for (;;) {
        uint32_t version = steal_area.version;
        rmb();
        uint64_t steal = steal_area.steal;
        rmb();
        if (!(version & 1) && steal_area.version == version) return steal;
        cpu_relax();
    }
}

/* The TSC's rate from kvmclock's scale (0: not offered). The area is registered only to read it, then released. */
uint64_t kvm_tsc_hz(void) {
    if (!kvm_feature(KVM_FEATURE_CLOCKSOURCE2)) return 0;
    wrmsr(MSR_KVM_SYSTEM_TIME_NEW, (uint64_t)(uintptr_t)&time_info | MSR_ENABLE);
    uint32_t version, mul;
    int8_t shift;
    do {
        version = time_info.version;
        rmb();
        mul = time_info.tsc_to_system_mul;
        shift = time_info.tsc_shift;
        rmb();
    } while ((version & 1) || version != time_info.version);
    wrmsr(MSR_KVM_SYSTEM_TIME_NEW, 0);
    if (!mul) return 0;
    uint64_t hz = (uint64_t)(((__uint128_t)1000000000ull << 32) / mul);
    return shift < 0 ? hz << -shift : hz >> shift;
}
