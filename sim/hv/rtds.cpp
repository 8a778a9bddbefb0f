// Xen RTDS: EDF over vCPUs, each a deferrable server (budget kept while idle, refilled at each period, whose
// end is its deadline). Global over the vCPUs' affinities, or partitioned (each vCPU on its home pCPU).
// extratime: a vCPU that used its budget may still run below every vCPU that has budget left.
#include "schedulers.h"

namespace rtv {

struct Rtds final : HvScheduler {
    std::vector<int> order;

    void init(Sim& sim) override {
        for (VCpu& v : sim.vcpus) PeriodicBudget::start(v, v.spec.budget, v.spec.period);
    }

    Time pick(Sim& sim, Time now) override {
        order.clear();
        for (const VCpu& v : sim.vcpus) {
            if (v.has_work() && (v.q > 0 || v.spec.extratime)) order.push_back(v.index);
        }
        std::sort(order.begin(), order.end(), [&](int a, int b) {
            const VCpu &x = sim.vcpus[a], &y = sim.vcpus[b];
            if ((x.q > 0) != (y.q > 0)) return x.q > 0;
            if (x.dl != y.dl) return x.dl < y.dl;
            return a < b;
        });
        sim.assign_ranked(order);
        return PeriodicBudget::horizon(sim, now);
    }

    void account(Sim& sim, Time from, Time to) override {
        PeriodicBudget::account(sim, from, to, &VCpuSpec::budget);
    }
};

std::unique_ptr<HvScheduler> make_rtds(const Config&) { return std::make_unique<Rtds>(); }

}  // namespace rtv
