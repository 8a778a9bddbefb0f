// Weighted round robin per pCPU, standing in for CFS: the runnable vCPUs take turns of slice * weight / 1024;
// a woken vCPU joins the back of the queue and never preempts the current turn.
#include "schedulers.h"

namespace rtv {

struct Fair final : HvScheduler {
    Time slice;
    int64_t counter = 0;
    std::vector<std::vector<int>> by_cpu;
    std::vector<int> current;
    std::vector<Time> turn_end;
    explicit Fair(const Config& cfg) : slice(cfg.fair_slice) {}

    void init(Sim& sim) override {
        by_cpu = vcpus_by_home(sim, [](const VCpu&, const VCpu&) { return false; });
        current.assign(static_cast<size_t>(sim.cfg.pcpus), -1);
        turn_end.assign(sim.vcpus.size(), 0);
        for (VCpu& v : sim.vcpus) v.stamp = ++counter;
    }
    void wake(Sim&, VCpu& v, Time) override { v.stamp = ++counter; }

    Time pick(Sim& sim, Time now) override {
        Time horizon = NEVER;
        for (int p = 0; p < sim.cfg.pcpus; ++p) {
            int cur = current[static_cast<size_t>(p)];
            int best = -1;
            if (cur >= 0 && sim.vcpus[cur].has_work() && now < turn_end[cur]) {
                best = cur;
            } else {
                if (cur >= 0 && sim.vcpus[cur].has_work()) sim.vcpus[cur].stamp = ++counter;
                for (int i : by_cpu[static_cast<size_t>(p)]) {
                    if (sim.vcpus[i].has_work() && (best < 0 || sim.vcpus[i].stamp < sim.vcpus[best].stamp)) best = i;
                }
                if (best >= 0) turn_end[best] = now + std::max<Time>(1, slice * sim.vcpus[best].spec.weight / 1024);
            }
            current[static_cast<size_t>(p)] = best;
            sim.cpus[p].run = best;
            if (best >= 0) horizon = std::min(horizon, turn_end[best]);
        }
        return horizon;
    }
};

std::unique_ptr<HvScheduler> make_fair(const Config& cfg) { return std::make_unique<Fair>(cfg); }

}  // namespace rtv
