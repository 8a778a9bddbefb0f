// Xen RTDS: EDF over vCPUs, each a deferrable server (budget kept while idle, refilled at each period, whose
// end is its deadline). Global over the vCPUs' affinities, or partitioned (each vCPU on its home pCPU).
// extratime: a vCPU that used its budget may still run below every vCPU that has budget left.
#include "schedulers.h"

namespace rtv {

struct Rtds final : HvScheduler {
    // Sort key of a runnable vCPU, one integer: budget spent (top bit), then deadline (deadlines are period
    // ends, never negative), then index (a strict total order). One integer comparison per step of the sort
    // instead of three fields: pick runs at most decision points. 64 bits when every deadline of the run and
    // every index fit (a run shorter than ~100 days with a few vCPUs), else 128.
    std::vector<uint64_t> narrow;
    std::vector<unsigned __int128> wide;
    int index_bits = 1;
    PeriodicBudget budgets;
    std::vector<int> order;

    void init(Sim& sim) override {
        budgets.start_all(sim, &VCpuSpec::budget);
        while ((size_t{1} << index_bits) < sim.vcpus.size()) ++index_bits;
        Time last_deadline = sim.cfg.duration;  // a deadline is at most one period past the last refill
        for (const VCpu& v : sim.vcpus) last_deadline = std::max(last_deadline, sim.cfg.duration + 2 * v.spec.period);
        if (last_deadline < (Time{1} << (62 - index_bits))) {
            narrow.resize(sim.vcpus.size());
        } else {
            wide.resize(sim.vcpus.size());
        }
        order.resize(sim.vcpus.size());
    }

    template <class Key>
    void rank(Sim& sim, std::vector<Key>& keys, int shift) {
        size_t n = 0;
        uint64_t occupied = 0;  // pCPUs the ranked vCPUs run on now (assign_ranked keeps them there if it can)
        const int spent = 8 * static_cast<int>(sizeof(Key)) - 1;
        for (const VCpu& v : sim.vcpus) {
            if (v.has_work() && (v.q > 0 || v.spec.extratime)) {
                keys[n++] = Key{v.q <= 0} << spent | Key{static_cast<uint64_t>(v.dl)} << shift |
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
        const Key mask = (Key{1} << shift) - 1;
        for (size_t i = 0; i < n; ++i) order[i] = static_cast<int>(keys[i] & mask);
        sim.assign_ranked(order.data(), n, occupied);
    }

    Time pick(Sim& sim, Time now) override {
        budgets.settle(sim, now);
        if (narrow.empty()) {
            rank(sim, wide, 32);
        } else {
            rank(sim, narrow, index_bits);
        }
        return budgets.horizon(sim, now);
    }

    void account(Sim& sim, Time, Time to) override {
        budgets.account(sim, to, &VCpuSpec::budget);
    }
};

std::unique_ptr<HvScheduler> make_rtds(const Config&) { return std::make_unique<Rtds>(); }

}  // namespace rtv
