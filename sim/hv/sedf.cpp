// Xen SEDF: per-pCPU EDF of domains with slice s per period p (deadline = end of the period).
// Short unblocking (SEDF): a domain that blocked during its current period and is woken before that period
// ends waits for its next release, even with slice left. SEDF' (sedf-prime) drops that rule.
#include "schedulers.h"

namespace rtv {

struct Sedf final : HvScheduler {
    bool short_unblocking;
    PeriodicBudget budgets;
    explicit Sedf(bool rule) : short_unblocking(rule) {}

    void init(Sim& sim) override {
        budgets.start_all(sim, &VCpuSpec::slice);
    }
    void block(Sim&, VCpu& v, Time now) override { v.blocked_at = now; }
    void wake(Sim&, VCpu& v, Time now) override {
        if (short_unblocking && v.blocked_at >= v.period_start && now < v.dl) v.q = 0;
    }

    Time pick(Sim& sim, Time now) override {
        budgets.settle(sim, now);
        for (const VCpu& v : sim.vcpus) {
            if (!v.has_work() || v.q == 0) continue;
            int& run = sim.cpus[v.spec.home].run;
            if (run < 0 || v.dl < sim.vcpus[run].dl) run = v.index;
        }
        return budgets.horizon(sim, now);
    }

    void account(Sim& sim, Time, Time to) override {
        budgets.account(sim, to, &VCpuSpec::slice);
    }
};

std::unique_ptr<HvScheduler> make_sedf(const Config&) { return std::make_unique<Sedf>(true); }
std::unique_ptr<HvScheduler> make_sedf_prime(const Config&) { return std::make_unique<Sedf>(false); }

}  // namespace rtv
