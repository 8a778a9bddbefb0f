// Factories of the hypervisor schedulers (one file each) and helpers they share.
#pragma once

#include <algorithm>
#include <memory>

#include "../core.h"

namespace rtv {

std::unique_ptr<HvScheduler> make_partitioned(const Config&);
std::unique_ptr<HvScheduler> make_fifo(const Config&);
std::unique_ptr<HvScheduler> make_rtds(const Config&);
std::unique_ptr<HvScheduler> make_sedf(const Config&);
std::unique_ptr<HvScheduler> make_sedf_prime(const Config&);
std::unique_ptr<HvScheduler> make_psedf(const Config&);
std::unique_ptr<HvScheduler> make_credit(const Config&);
std::unique_ptr<HvScheduler> make_arinc653(const Config&);
std::unique_ptr<HvScheduler> make_deadline(const Config&);
std::unique_ptr<HvScheduler> make_fair(const Config&);

// vCPU indices per home pCPU, in the order given by `before` (a strict weak order on vCPUs).
template <class Before>
std::vector<std::vector<int>> vcpus_by_home(const Sim& sim, Before before) {
    std::vector<std::vector<int>> lists(static_cast<size_t>(sim.cfg.pcpus));
    for (const VCpu& v : sim.vcpus) lists[static_cast<size_t>(v.spec.home)].push_back(v.index);
    for (auto& list : lists) {
        std::stable_sort(list.begin(), list.end(), [&](int a, int b) { return before(sim.vcpus[a], sim.vcpus[b]); });
    }
    return lists;
}

// A budget of `amount` refilled at every multiple of `period` (slice/period of SEDF, budget/period of servers).
// An instance remembers the earliest refill due, so the steps between refills look at no vCPU's period, and
// charges the running vCPUs only when their budgets are read or refilled (settle): a schedule changes only at
// a pick, so one charge per pick is the sum of the charges of every decision point since.
struct PeriodicBudget {
    Time earliest_refill = NEVER;
    Time charged_to = 0;

    static void start(VCpu& v, Time amount, Time period) {
        v.q = amount;
        v.period_start = 0;
        v.dl = v.next_repl = period;
    }
    static void refill_due(VCpu& v, Time now, Time amount, Time period) {
        while (v.next_repl <= now) {
            v.q = amount;
            v.period_start = v.next_repl;
            v.next_repl += period;
            v.dl = v.next_repl;
        }
    }
    static void charge(VCpu& v, Time used) { v.q = std::max<Time>(0, v.q - used); }

    // start() every vCPU with the VCpuSpec field `amount` names (budget for servers, slice for SEDF)
    void start_all(Sim& sim, Time VCpuSpec::*amount) {
        earliest_refill = NEVER;
        for (VCpu& v : sim.vcpus) {
            start(v, v.spec.*amount, v.spec.period);
            earliest_refill = std::min(earliest_refill, v.next_repl);
        }
    }

    // Charge the vCPUs that ran since the last charge up to `now`: those with a pCPU (in a pick, before the
    // new assignment is applied, those of the last one). Every pick calls it before reading any budget.
    void settle(Sim& sim, Time now) {
        const Time used = now - charged_to;
        charged_to = now;
        if (used <= 0) return;
        for (VCpu& v : sim.vcpus) {
            if (v.on_cpu >= 0) charge(v, used);
        }
    }

    // Apply the refills due by `to`, the running vCPUs charged up to it first.
    void account(Sim& sim, Time to, Time VCpuSpec::*amount) {
        if (to < earliest_refill) return;
        settle(sim, to);
        earliest_refill = NEVER;
        for (VCpu& v : sim.vcpus) {
            refill_due(v, to, v.spec.*amount, v.spec.period);
            earliest_refill = std::min(earliest_refill, v.next_repl);
        }
    }

    // The next instant the schedule can change: a refill, or a running vCPU with budget running out.
    Time horizon(const Sim& sim, Time now) const {
        Time next = earliest_refill;
        for (const PCpu& c : sim.cpus) {
            if (c.run >= 0 && sim.vcpus[c.run].q > 0) next = std::min(next, now + sim.vcpus[c.run].q);
        }
        return next;
    }
};

}  // namespace rtv
