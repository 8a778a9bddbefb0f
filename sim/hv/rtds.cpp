// Xen RTDS: EDF over vCPUs, each a deferrable server (budget kept while idle, refilled at each period, whose
// end is its deadline). Global over the vCPUs' affinities, or partitioned (each vCPU on its home pCPU).
// extratime: a vCPU that used its budget may still run below every vCPU that has budget left.
#include "schedulers.h"

namespace rtv {

struct Rtds final : HvScheduler {
    // sort key: vCPUs with budget first, then earliest deadline, then index (a strict total order)
    struct Rank {
        bool spent;
        Time dl;
        int index;
        bool operator<(const Rank& o) const {
            if (spent != o.spent) return o.spent;
            return dl != o.dl ? dl < o.dl : index < o.index;
        }
    };
    std::vector<Rank> ranks;
    PeriodicBudget budgets;
    std::vector<int> order;

    void init(Sim& sim) override {
        budgets.start_all(sim, &VCpuSpec::budget);
    }

    Time pick(Sim& sim, Time now) override {
        ranks.clear();
        for (const VCpu& v : sim.vcpus) {
            if (v.has_work() && (v.q > 0 || v.spec.extratime)) ranks.push_back(Rank{v.q <= 0, v.dl, v.index});
        }
        std::sort(ranks.begin(), ranks.end());
        order.clear();
        for (const Rank& r : ranks) order.push_back(r.index);
        sim.assign_ranked(order);
        return budgets.horizon(sim, now);
    }

    void account(Sim& sim, Time from, Time to) override {
        budgets.account(sim, from, to, &VCpuSpec::budget);
    }
};

std::unique_ptr<HvScheduler> make_rtds(const Config&) { return std::make_unique<Rtds>(); }

}  // namespace rtv
