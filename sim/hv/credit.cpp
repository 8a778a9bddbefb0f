// Xen Credit (credit1), per-pCPU run queues. Every accounting period each pCPU hands out one period's worth of
// credit to its active vCPUs in proportion to their weights (credit is capped at one time slice); running
// debits credit. Classes: BOOST (woken while UNDER, until the next accounting) > UNDER (credit >= 0) > OVER;
// round robin inside a class with a time slice; a cap (% of one CPU) parks a vCPU until the next accounting;
// the rate limit keeps a just-scheduled vCPU on its pCPU for at least that long unless it blocks.
#include "schedulers.h"

namespace rtv {

struct Credit final : HvScheduler {
    struct State {
        Time credit = 0, used = 0, since = 0, slice_end = 0;
        bool boost = false, parked = false;
    };
    Time slice, accounting, rate_limit, next_accounting;
    int64_t counter = 0;
    std::vector<State> st;
    std::vector<std::vector<int>> by_cpu;
    std::vector<int> current;

    explicit Credit(const Config& cfg)
        : slice(cfg.credit_slice), accounting(cfg.credit_accounting), rate_limit(cfg.credit_rate_limit),
          next_accounting(cfg.credit_accounting) {}

    int klass(const VCpu& v) const {
        const State& s = st[static_cast<size_t>(v.index)];
        return s.boost ? 2 : (s.credit >= 0 ? 1 : 0);
    }
    bool eligible(const VCpu& v) const { return v.has_work() && !st[static_cast<size_t>(v.index)].parked; }
    Time cap_ns(const VCpu& v) const { return static_cast<Time>(v.spec.cap / 100.0 * static_cast<double>(accounting)); }

    void init(Sim& sim) override {
        st.assign(sim.vcpus.size(), State{});
        by_cpu = vcpus_by_home(sim, [](const VCpu&, const VCpu&) { return false; });
        current.assign(static_cast<size_t>(sim.cfg.pcpus), -1);
        for (VCpu& v : sim.vcpus) v.stamp = ++counter;
    }
    void wake(Sim&, VCpu& v, Time) override {
        State& s = st[static_cast<size_t>(v.index)];
        if (s.credit >= 0) s.boost = true;
        v.stamp = ++counter;
    }
    void block(Sim&, VCpu& v, Time) override { st[static_cast<size_t>(v.index)].boost = false; }

    Time pick(Sim& sim, Time now) override {
        Time horizon = next_accounting;
        for (int p = 0; p < sim.cfg.pcpus; ++p) {
            int cur = current[static_cast<size_t>(p)];
            bool cur_ok = cur >= 0 && eligible(sim.vcpus[cur]);
            int best = -1;
            if (cur_ok && now - st[cur].since < rate_limit) {
                best = cur;
            } else {
                bool keeps_turn = cur_ok && now < st[cur].slice_end;
                if (cur_ok && !keeps_turn) sim.vcpus[cur].stamp = ++counter;  // slice used up: back of its class
                for (int i : by_cpu[static_cast<size_t>(p)]) {
                    const VCpu& v = sim.vcpus[i];
                    if (!eligible(v)) continue;
                    if (best < 0) {
                        best = i;
                        continue;
                    }
                    const VCpu& b = sim.vcpus[best];
                    int kv = klass(v), kb = klass(b);
                    if (kv != kb) {
                        if (kv > kb) best = i;
                        continue;
                    }
                    if (keeps_turn && best == cur) continue;
                    if ((keeps_turn && i == cur) || v.stamp < b.stamp) best = i;
                }
                if (best != cur) {
                    if (cur_ok) sim.vcpus[cur].stamp = ++counter;  // preempted: back of its class
                }
                if (best >= 0 && (best != cur || !keeps_turn)) {
                    st[best].since = now;
                    st[best].slice_end = now + slice;
                }
            }
            current[static_cast<size_t>(p)] = best;
            sim.cpus[p].run = best;
            if (best < 0) continue;
            const State& s = st[best];
            horizon = std::min(horizon, s.slice_end);
            if (s.since + rate_limit > now) horizon = std::min(horizon, s.since + rate_limit);
            if (s.credit >= 0 && !s.boost) horizon = std::min(horizon, now + s.credit + 1);  // UNDER -> OVER
            if (sim.vcpus[best].spec.cap > 0) horizon = std::min(horizon, now + std::max<Time>(1, cap_ns(sim.vcpus[best]) - s.used));
        }
        return horizon;
    }

    void account(Sim& sim, Time from, Time to) override {
        for (const PCpu& c : sim.cpus) {
            if (c.run < 0) continue;
            State& s = st[static_cast<size_t>(c.run)];
            s.credit -= to - from;
            s.used += to - from;
            const VCpu& v = sim.vcpus[c.run];
            if (v.spec.cap > 0 && s.used >= cap_ns(v)) s.parked = true;
        }
        while (to >= next_accounting) {
            for (const auto& list : by_cpu) {
                int64_t weights = 0;
                for (int i : list) {
                    if (sim.vcpus[i].has_work() || st[i].used > 0) weights += sim.vcpus[i].spec.weight;
                }
                for (int i : list) {
                    State& s = st[static_cast<size_t>(i)];
                    if (weights > 0 && (sim.vcpus[i].has_work() || s.used > 0)) {
                        s.credit = std::min(slice, s.credit + accounting * sim.vcpus[i].spec.weight / weights);
                    }
                    s.credit = std::max(-slice, s.credit);
                    s.used = 0;
                    s.boost = false;
                    s.parked = false;
                }
            }
            next_accounting += accounting;
        }
    }
};

std::unique_ptr<HvScheduler> make_credit(const Config& cfg) { return std::make_unique<Credit>(cfg); }

}  // namespace rtv
