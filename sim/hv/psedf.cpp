// PSEDF: domains marked rt run first, by preemptive fixed priority, each limited to its slice per period
// (kept while idle); the other domains run under SEDF (with short unblocking) only when no rt domain is ready.
#include "schedulers.h"

namespace rtv {

struct Psedf final : HvScheduler {
    std::vector<std::vector<int>> rt_by_cpu;
    PeriodicBudget budgets;

    void init(Sim& sim) override {
        rt_by_cpu = vcpus_by_home(sim, [](const VCpu& a, const VCpu& b) { return a.spec.priority > b.spec.priority; });
        for (auto& list : rt_by_cpu) {
            list.erase(std::remove_if(list.begin(), list.end(), [&](int i) { return !sim.vcpus[i].spec.rt; }),
                       list.end());
        }
        budgets.start_all(sim, &VCpuSpec::slice);
    }
    void block(Sim&, VCpu& v, Time now) override { v.blocked_at = now; }
    void wake(Sim&, VCpu& v, Time now) override {
        if (!v.spec.rt && v.blocked_at >= v.period_start && now < v.dl) v.q = 0;
    }

    Time pick(Sim& sim, Time now) override {
        budgets.settle(sim, now);
        for (int p = 0; p < sim.cfg.pcpus; ++p) {
            for (int i : rt_by_cpu[static_cast<size_t>(p)]) {
                if (sim.vcpus[i].has_work() && sim.vcpus[i].q > 0) {
                    sim.cpus[p].run = i;
                    break;
                }
            }
        }
        for (const VCpu& v : sim.vcpus) {
            if (v.spec.rt || !v.has_work() || v.q == 0) continue;
            int& run = sim.cpus[v.spec.home].run;
            if (run < 0 || (!sim.vcpus[run].spec.rt && v.dl < sim.vcpus[run].dl)) run = v.index;
        }
        return budgets.horizon(sim, now);
    }

    void account(Sim& sim, Time, Time to) override {
        budgets.account(sim, to, &VCpuSpec::slice);
    }
};

std::unique_ptr<HvScheduler> make_psedf(const Config&) { return std::make_unique<Psedf>(); }

}  // namespace rtv
