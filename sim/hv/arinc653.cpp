// ARINC 653: a major frame repeats forever; each pCPU's frame is split into fixed windows, each owned by one
// vCPU, which runs in its window if it has work. Time outside windows and unused windows stay idle.
#include "schedulers.h"

namespace rtv {

struct Arinc653 final : HvScheduler {
    struct Slot {
        Time start, end;
        int vcpu;
    };
    Time frame;
    std::vector<std::vector<Slot>> slots;
    explicit Arinc653(const Config& cfg) : frame(cfg.major_frame) {}

    void init(Sim& sim) override {
        slots.assign(static_cast<size_t>(sim.cfg.pcpus), {});
        for (const VCpu& v : sim.vcpus) {
            for (const Window& w : v.spec.windows) slots[v.spec.home].push_back(Slot{w.start, w.start + w.length, v.index});
        }
        for (auto& list : slots) std::sort(list.begin(), list.end(), [](const Slot& a, const Slot& b) { return a.start < b.start; });
    }

    Time pick(Sim& sim, Time now) override {
        Time phase = now % frame, boundary = frame;
        for (int p = 0; p < sim.cfg.pcpus; ++p) {
            for (const Slot& s : slots[static_cast<size_t>(p)]) {
                if (s.start <= phase && phase < s.end && sim.vcpus[s.vcpu].has_work()) sim.cpus[p].run = s.vcpu;
                if (s.start > phase) boundary = std::min(boundary, s.start);
                if (s.end > phase) boundary = std::min(boundary, s.end);
            }
        }
        return now - phase + boundary;
    }
};

std::unique_ptr<HvScheduler> make_arinc653(const Config& cfg) { return std::make_unique<Arinc653>(cfg); }

}  // namespace rtv
