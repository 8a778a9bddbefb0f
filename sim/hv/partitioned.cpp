// Partitioned / NULL (Jailhouse, Bao, Xen NULL): every vCPU owns its pCPU, there is nothing to decide.
#include "schedulers.h"

namespace rtv {

struct Partitioned final : HvScheduler {
    Time pick(Sim& sim, Time) override {
        for (const VCpu& v : sim.vcpus) {
            if (v.has_work()) sim.cpus[v.spec.home].run = v.index;
        }
        return NEVER;
    }
};

std::unique_ptr<HvScheduler> make_partitioned(const Config&) { return std::make_unique<Partitioned>(); }

}  // namespace rtv
