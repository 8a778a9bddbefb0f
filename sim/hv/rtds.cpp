// Xen RTDS: EDF over vCPUs, each a deferrable server (budget kept while idle, refilled at each period, whose
// end is its deadline). Global over the vCPUs' affinities, or partitioned (each vCPU on its home pCPU).
// extratime: a vCPU that used its budget may still run below every vCPU that has budget left.
#include "schedulers.h"

namespace rtv {

struct Rtds final : HvScheduler {
    // Sort key of a runnable vCPU, one 128-bit integer: budget spent (bit 127), then deadline (bits 32-94:
    // deadlines are period ends, never negative), then index (a strict total order). One integer comparison per
    // step of the sort instead of three fields: pick runs at most decision points.
    using Key = unsigned __int128;
    std::vector<Key> keys;
    PeriodicBudget budgets;
    std::vector<int> order;

    void init(Sim& sim) override {
        budgets.start_all(sim, &VCpuSpec::budget);
        keys.resize(sim.vcpus.size());
        order.resize(sim.vcpus.size());
    }

    Time pick(Sim& sim, Time now) override {
        size_t n = 0;
        uint64_t occupied = 0;  // pCPUs the ranked vCPUs run on now (assign_ranked keeps them there if it can)
        for (const VCpu& v : sim.vcpus) {
            if (v.has_work() && (v.q > 0 || v.spec.extratime)) {
                keys[n++] = Key{v.q <= 0} << 127 | Key{static_cast<uint64_t>(v.dl)} << 32 |
                            static_cast<uint32_t>(v.index);
                if (v.on_cpu >= 0) occupied |= uint64_t{1} << v.on_cpu;
            }
        }
        for (size_t i = 1; i < n; ++i) {  // insertion sort: a handful of vCPUs, mostly in order already
            const Key key = keys[i];
            size_t j = i;
            for (; j > 0 && keys[j - 1] > key; --j) keys[j] = keys[j - 1];
            keys[j] = key;
        }
        for (size_t i = 0; i < n; ++i) order[i] = static_cast<int>(static_cast<uint32_t>(keys[i]));
        sim.assign_ranked(order.data(), n, occupied);
        return budgets.horizon(sim, now);
    }

    void account(Sim& sim, Time from, Time to) override {
        budgets.account(sim, from, to, &VCpuSpec::budget);
    }
};

std::unique_ptr<HvScheduler> make_rtds(const Config&) { return std::make_unique<Rtds>(); }

}  // namespace rtv
