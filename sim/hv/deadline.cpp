// Linux SCHED_DEADLINE: each vCPU with a runtime is a constant-bandwidth server (runtime Q, relative deadline
// D, period P), scheduled by global EDF over its affinity. On wake-up, if the current deadline has passed or
// the remaining runtime would exceed the bandwidth Q/D up to that deadline, the server gets deadline now + D
// and a full runtime. A server that used its runtime is throttled until its next period (deadline - D + P);
// then, as replenish_dl_entity does, its deadline moves by P and Q is added to its runtime until the runtime is
// positive, so an overrun is paid back by whole periods. vCPUs without a runtime run below all servers, in
// turns of the fair time slice (SCHED_OTHER).
//
// With an enforcement tick (a kernel without HRTICK_DL), the runtime is checked only at the tick, when the
// server blocks or when it is preempted: a running server overruns up to the next tick and carries the overrun
// as a negative runtime into its replenishment. A replenished server resumes after a wake-up latency drawn
// from [0, resume_jitter] or from the measured resume_latencies: where its runtime runs out just at a tick,
// that latency decides the next holes.
#include "schedulers.h"

namespace rtv {

struct Deadline final : HvScheduler {
    Time slice, tick, phase, jitter;
    std::vector<Time> latencies;
    Rng rng;
    int64_t counter = 0;
    std::vector<bool> throttled;
    std::vector<Time> replenish_at, turn_end;
    std::vector<int> order, background;
    explicit Deadline(const Config& cfg)
        : slice(cfg.fair_slice), tick(cfg.enforcement_tick), phase(cfg.enforcement_phase), jitter(cfg.resume_jitter),
          latencies(cfg.resume_latencies), rng(cfg.seed ^ 0xD1B54A32D192ED03ULL) {}

    static bool is_server(const VCpu& v) { return v.spec.runtime > 0; }
    static Time rel_deadline(const VCpu& v) { return v.spec.deadline > 0 ? v.spec.deadline : v.spec.period; }

    // the first enforcement point at or after t (t itself without a tick)
    Time enforced_at(Time t) const {
        if (tick <= 0) return t;
        Time into = ((t - phase) % tick + tick) % tick;
        return into == 0 ? t : t + tick - into;
    }
    bool is_enforcement_point(Time t) const { return tick <= 0 || ((t - phase) % tick + tick) % tick == 0; }

    Time resume_latency() {
        if (!latencies.empty())
            return latencies[static_cast<size_t>(rng.uniform(0, static_cast<Time>(latencies.size()) - 1))];
        return jitter > 0 ? rng.uniform(0, jitter) : 0;
    }

    void throttle(VCpu& v) {
        throttled[static_cast<size_t>(v.index)] = true;
        replenish_at[static_cast<size_t>(v.index)] = v.dl - rel_deadline(v) + v.spec.period;
    }

    void init(Sim& sim) override {
        throttled.assign(sim.vcpus.size(), false);
        replenish_at.assign(sim.vcpus.size(), NEVER);
        turn_end.assign(sim.vcpus.size(), 0);
        for (VCpu& v : sim.vcpus) {
            v.q = 0;
            v.dl = 0;
            v.stamp = ++counter;
            // a gap probe spins from the start and so never wakes up: its server starts its first period now
            if (is_server(v) && v.has_work()) wake(sim, v, 0);
        }
    }

    void wake(Sim&, VCpu& v, Time now) override {
        if (!is_server(v)) {
            v.stamp = ++counter;
            return;
        }
        if (throttled[static_cast<size_t>(v.index)]) return;
        // runtime / (deadline - now) > Q / D, in integers: runtime * D > (deadline - now) * Q
        bool overflow = static_cast<__int128>(v.q) * rel_deadline(v) >
                        static_cast<__int128>(v.dl - now) * v.spec.runtime;
        if (v.dl <= now || overflow) {
            v.dl = now + rel_deadline(v);
            v.q = v.spec.runtime;
        }
    }

    // dequeued with its runtime used up (only possible between ticks): the kernel throttles it there
    void block(Sim&, VCpu& v, Time) override {
        if (is_server(v) && v.q <= 0 && !throttled[static_cast<size_t>(v.index)]) throttle(v);
    }

    Time pick(Sim& sim, Time now) override {
        order.clear();
        background.clear();
        for (VCpu& v : sim.vcpus) {
            if (!v.has_work()) continue;
            if (is_server(v)) {
                // a server in debt (between ticks) runs on only while it keeps its CPU
                bool runnable = v.q > 0 || v.on_cpu >= 0;
                if (!throttled[static_cast<size_t>(v.index)] && runnable) order.push_back(v.index);
            } else {
                if (v.on_cpu >= 0 && now >= turn_end[static_cast<size_t>(v.index)]) v.stamp = ++counter;
                background.push_back(v.index);
            }
        }
        std::sort(order.begin(), order.end(), [&](int a, int b) {
            return sim.vcpus[a].dl != sim.vcpus[b].dl ? sim.vcpus[a].dl < sim.vcpus[b].dl : a < b;
        });
        std::sort(background.begin(), background.end(),
                  [&](int a, int b) { return sim.vcpus[a].stamp < sim.vcpus[b].stamp; });
        order.insert(order.end(), background.begin(), background.end());
        sim.assign_ranked(order);
        Time horizon = NEVER;
        for (VCpu& v : sim.vcpus) {  // preempted in debt: put_prev_task's accounting throttles it
            if (is_server(v) && v.q <= 0 && !throttled[static_cast<size_t>(v.index)] && v.on_cpu >= 0) {
                bool kept = false;
                for (const PCpu& c : sim.cpus) kept = kept || c.run == v.index;
                if (!kept) throttle(v);
            }
        }
        for (size_t i = 0; i < sim.vcpus.size(); ++i) {
            if (throttled[i]) horizon = std::min(horizon, replenish_at[i]);
        }
        for (const PCpu& c : sim.cpus) {
            if (c.run < 0) continue;
            const VCpu& v = sim.vcpus[c.run];
            if (is_server(v)) {
                horizon = std::min(horizon, enforced_at(now + std::max<Time>(v.q, 1)));
            } else {
                if (v.on_cpu != &c - &sim.cpus[0] || now >= turn_end[static_cast<size_t>(v.index)])
                    turn_end[static_cast<size_t>(v.index)] = now + slice;
                horizon = std::min(horizon, turn_end[static_cast<size_t>(v.index)]);
            }
        }
        return horizon;
    }

    void account(Sim& sim, Time from, Time to) override {
        for (const PCpu& c : sim.cpus) {
            if (c.run < 0) continue;
            VCpu& v = sim.vcpus[c.run];
            if (!is_server(v)) continue;
            v.q -= to - from;
            if (v.q <= 0 && is_enforcement_point(to)) {
                if (tick <= 0) v.q = 0;  // enforced exactly: never overruns
                throttle(v);
            }
        }
        for (VCpu& v : sim.vcpus) {
            size_t i = static_cast<size_t>(v.index);
            if (!throttled[i] || replenish_at[i] > to) continue;
            if (v.q <= 0 || v.dl <= to) {  // the replenishment timer fired: a period's runtime
                while (v.q <= 0) {  // an overrun costs whole periods
                    v.dl += v.spec.period;
                    v.q += v.spec.runtime;
                }
                if (v.dl <= to) {  // fell behind: start a fresh period
                    v.dl = to + rel_deadline(v);
                    v.q = v.spec.runtime;
                }
                Time latency = resume_latency();
                if (latency > 0) {  // replenished, running again once woken
                    replenish_at[i] = to + latency;
                    continue;
                }
            }
            throttled[i] = false;
            replenish_at[i] = NEVER;
        }
    }
};

std::unique_ptr<HvScheduler> make_deadline(const Config& cfg) { return std::make_unique<Deadline>(cfg); }

}  // namespace rtv
