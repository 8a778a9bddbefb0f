/* KVM's stolen time on Arm (the paravirtualized time of Arm's DEN0057A): asked for through SMCCC on the PSCI
 * conduit, as Linux does: PSCI 1.0 or later says whether SMCCC_VERSION exists; SMCCC 1.1 or later answers
 * ARCH_FEATURES; then PV_TIME_FEATURES(PV_TIME_ST) and PV_TIME_ST, which returns the address of this vCPU's
 * structure (its stolen_time: ns, little-endian, written by KVM each time it loads the vCPU again, from its
 * thread's run delay). Asking a PSCI that is older, or calling a function it does not know, never happens: an HVC
 * nobody answers is an undefined instruction (QEMU's TCG without EL2). */
#include "kernel.h"

enum { PSCI_VERSION = 0x84000000u, PSCI_FEATURES = 0x8400000au, SMCCC_VERSION = 0x80000000u,
       SMCCC_ARCH_FEATURES = 0x80000001u, PV_TIME_FEATURES = 0xc5000020u, PV_TIME_ST = 0xc5000021u };

struct pv_stolen_time {
    uint32_t revision, attributes;
    uint64_t stolen_time;
    uint8_t pad[48];
};
_Static_assert(sizeof(struct pv_stolen_time) == 64, "DEN0057A's layout");

static volatile struct pv_stolen_time *area;

static int32_t call(uint32_t function, uint64_t a1) { return (int32_t)smccc_call(function, a1, 0, 0); }

bool pv_steal_init(const char **source) {
    if (!platform.has_psci || call(PSCI_VERSION, 0) < 0x10000) return false; /* major.minor as 16.16 */
    if (call(PSCI_FEATURES, SMCCC_VERSION) < 0 || call(SMCCC_VERSION, 0) < 0x10001) return false;
    if (call(SMCCC_ARCH_FEATURES, PV_TIME_FEATURES) < 0 || call(PV_TIME_FEATURES, PV_TIME_ST) < 0) return false;
    uint64_t address = smccc_call(PV_TIME_ST, 0, 0, 0);
    if ((int64_t)address < 0 || (address & 63)) return false;
    map_normal_page(address);
    area = (volatile struct pv_stolen_time *)(uintptr_t)address;
    *source = "kvm-pv-time";
    return true;
}

uint64_t pv_steal_ns(void) { return area->stolen_time; } /* one 64-bit write by KVM: read whole */
