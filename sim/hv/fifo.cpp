// Fixed priority per pCPU (RT-Xen style), optionally with a budget/period server per vCPU:
//  deferrable               budget kept while idle, used only while running;
//  periodic (pure)          the highest-priority vCPU with budget holds the pCPU; if it has no work the budget
//                           idles away and the pCPU stays idle;
//  work-conserving-periodic as periodic, but while the holder idles (its budget still draining) the next
//                           lower-priority vCPU with work and budget runs on its own budget;
//  slack-stealing-periodic  while the holder idles, the highest-priority vCPU with work runs on the holder's
//                           budget (the idle budget is lent), its own budget untouched.
#include <string>

#include "schedulers.h"

namespace rtv {

enum Server { NONE, DEFERRABLE, PURE_PERIODIC, WORK_CONSERVING, SLACK_STEALING };

struct FixedPriority final : HvScheduler {
    Server server;
    std::vector<std::vector<int>> by_cpu;
    std::vector<int> holder, runner;  // per pCPU: whose budget drains as holder / who runs on own budget

    explicit FixedPriority(Server s) : server(s) {}

    void init(Sim& sim) override {
        by_cpu = vcpus_by_home(sim, [](const VCpu& a, const VCpu& b) { return a.spec.priority > b.spec.priority; });
        holder.assign(static_cast<size_t>(sim.cfg.pcpus), -1);
        runner.assign(static_cast<size_t>(sim.cfg.pcpus), -1);
        if (server == NONE) return;
        for (VCpu& v : sim.vcpus) PeriodicBudget::start(v, v.spec.budget, v.spec.period);
    }

    Time pick(Sim& sim, Time now) override {
        Time horizon = NEVER;
        for (int p = 0; p < sim.cfg.pcpus; ++p) {
            const auto& list = by_cpu[static_cast<size_t>(p)];
            int run = -1, hold = -1, own = -1;
            if (server == NONE || server == DEFERRABLE) {
                for (int i : list) {
                    const VCpu& v = sim.vcpus[i];
                    if (v.has_work() && (server == NONE || v.q > 0)) {
                        run = own = i;
                        break;
                    }
                }
            } else {
                size_t h = 0;
                while (h < list.size() && sim.vcpus[list[h]].q == 0) ++h;
                if (h < list.size()) {
                    hold = list[h];
                    if (sim.vcpus[hold].has_work()) {
                        run = hold;
                    } else if (server == WORK_CONSERVING) {
                        for (size_t j = h + 1; j < list.size(); ++j) {
                            const VCpu& v = sim.vcpus[list[j]];
                            if (v.has_work() && v.q > 0) {
                                run = own = list[j];
                                break;
                            }
                        }
                    } else if (server == SLACK_STEALING) {
                        for (int i : list) {
                            if (sim.vcpus[i].has_work()) {
                                run = i;
                                break;
                            }
                        }
                    }
                }
            }
            sim.cpus[p].run = run;
            holder[static_cast<size_t>(p)] = hold;
            runner[static_cast<size_t>(p)] = own;
            if (server != NONE) {
                if (hold >= 0) horizon = std::min(horizon, now + sim.vcpus[hold].q);
                if (own >= 0) horizon = std::min(horizon, now + sim.vcpus[own].q);
            }
        }
        if (server != NONE) {
            for (const VCpu& v : sim.vcpus) horizon = std::min(horizon, v.next_repl);
        }
        return horizon;
    }

    void account(Sim& sim, Time from, Time to) override {
        if (server == NONE) return;
        for (int p = 0; p < sim.cfg.pcpus; ++p) {
            if (holder[static_cast<size_t>(p)] >= 0) PeriodicBudget::charge(sim.vcpus[holder[p]], to - from);
            if (runner[static_cast<size_t>(p)] >= 0) PeriodicBudget::charge(sim.vcpus[runner[p]], to - from);
        }
        for (VCpu& v : sim.vcpus) PeriodicBudget::refill_due(v, to, v.spec.budget, v.spec.period);
    }
};

std::unique_ptr<HvScheduler> make_fifo(const Config& cfg) {
    const std::string& s = cfg.server;
    Server server = s == "deferrable" ? DEFERRABLE
                    : s == "periodic" ? PURE_PERIODIC
                    : s == "work-conserving-periodic" ? WORK_CONSERVING
                    : s == "slack-stealing-periodic" ? SLACK_STEALING
                                                     : NONE;
    return std::make_unique<FixedPriority>(server);
}

}  // namespace rtv
