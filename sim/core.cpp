// The event loop: see core.h for the design.
#include "core.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace rtv {

double Rng::normal() {  // Box-Muller
    double u1 = unit(), u2 = unit();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

uint32_t ReadyQueue::claim() {
    if (free_slots.empty()) {
        slots.emplace_back();
        return static_cast<uint32_t>(slots.size() - 1);
    }
    const uint32_t slot = free_slots.back();
    free_slots.pop_back();
    return slot;
}

void ReadyQueue::queue(uint32_t slot) {
    heap.push_back(Entry{slots[slot].key, slots[slot].seq, slot});
    std::push_heap(heap.begin(), heap.end(), std::greater<Entry>());
}

void ReadyQueue::pop() {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Entry>());
    free_slots.push_back(heap.back().slot);
    heap.pop_back();
}

enum EventKind { EV_RELEASE = 0, EV_CHAIN = 1, EV_STAGE = 2 };

Sim::Sim(Config config) : cfg(std::move(config)), rng_(cfg.seed) {
    if (cfg.pcpus < 1 || cfg.pcpus > 64) throw std::invalid_argument("pcpus must be 1..64");
    for (const auto& entry : hv_registry()) {
        if (cfg.scheduler == entry.name) hv = entry.make(cfg);
    }
    if (!hv) throw std::invalid_argument("unknown hypervisor scheduler: " + cfg.scheduler);
    cpus.resize(cfg.pcpus);
    vcpus.resize(cfg.vcpus.size());
    for (size_t i = 0; i < vcpus.size(); ++i) {
        vcpus[i].spec = cfg.vcpus[i];
        vcpus[i].index = static_cast<int>(i);
    }
    for (const auto& task : cfg.tasks) {
        if (task.vcpu < 0 || task.vcpu >= static_cast<int>(vcpus.size())) throw std::invalid_argument("task vcpu");
    }
    for (int policy : cfg.guest) guest_keys_.push_back(guest_registry().at(static_cast<size_t>(policy)).key);
    // task codes are int16 in the records (the stored `thread` column)
    if (cfg.tasks.size() > 32767) throw std::invalid_argument("at most 32767 tasks");
    jobs.with_release = std::any_of(cfg.tasks.begin(), cfg.tasks.end(), [](const TaskSpec& t) { return t.jitter > 0; });
    jobs.with_event = !cfg.chains.empty();
    task_stats.resize(cfg.tasks.size());
    supply_.resize(vcpus.size());
    previous_.assign(static_cast<size_t>(cfg.pcpus), -1);
    std::fill(std::begin(gantt_open_), std::end(gantt_open_), -1);
    gantt_ = cfg.gantt_to > cfg.gantt_from;
    gap_probes_ = std::any_of(cfg.vcpus.begin(), cfg.vcpus.end(), [](const VCpuSpec& v) { return v.gap_threshold >= 0; });
    eager_ = gantt_ || gap_probes_;
}

void Sim::push(Time t, int prio, int kind, int index, int64_t a, Time b) {
    queue_.push(Event{t, Event::order_of(prio, seq_++), kind, index, a, b});
}

Time Sim::draw_exec(const TaskSpec& task) {
    switch (task.dist) {
        case UNIFORM:
            return rng_.uniform(task.emin, task.emax);
        case NORMAL: {
            double x = static_cast<double>(task.emean) + rng_.normal() * static_cast<double>(task.estdev);
            return std::clamp(static_cast<Time>(std::llround(x)), task.emin, task.emax);
        }
        default:
            return task.exec;
    }
}

void Sim::schedule_next_arrival(int task_index, Time nominal) {
    const TaskSpec& task = cfg.tasks[task_index];
    Time jitter = task.jitter ? rng_.uniform(0, task.jitter) : 0;
    push(nominal + jitter, 1, EV_RELEASE, task_index, 0, nominal);
}

bool Sim::any_cpu_idle() const {
    for (const auto& c : cpus) {
        if (c.run < 0 || !vcpus[c.run].has_work()) return true;
    }
    return false;
}

void Sim::release(int task_index, Time arrival, Time release_time, int64_t event, Time event_arrival) {
    const TaskSpec& task = cfg.tasks[task_index];
    VCpu& v = vcpus[task.vcpu];
    bool was_idle = !v.has_work();
    const uint32_t slot = v.ready.claim();
    Job& job = v.ready.slots[slot];  // a reused slot: every field is set here
    job.task = task_index;
    job.seq = ++job_seq_;
    job.arrival = arrival;
    job.release = release_time;
    job.deadline = task.deadline >= NEVER ? NEVER : arrival + task.deadline;
    job.remaining = draw_exec(task);
    job.start = -1;
    job.event = event;
    job.event_arrival = event_arrival;
    job.key = guest_keys_[static_cast<size_t>(v.spec.vm)](task, job);
    // A running vCPU whose head job changes (it ran none, or the new job comes first: a larger seq loses a tie)
    // is accounted up to now with the job it ran, and planned with the new one; otherwise nothing changes there.
    const bool new_head = v.on_cpu >= 0 && (v.ready.empty() || job.key < v.ready.top().key);
    if (new_head) catch_up(v.on_cpu, now);
    v.ready.queue(slot);
    if (new_head) plan(v.on_cpu);
    if (was_idle) {
        hv->wake(*this, v, now);
        if (cfg.quantum == 0 || any_cpu_idle()) resched_ = true;
    }
}

void Sim::assign_ranked(const int* order, size_t n) {
    // Best first, each takes a free pCPU it may use: its current one if free, else the lowest one no other
    // candidate is running on (fewer migrations), else the lowest. Bit masks: pcpus <= 64.
    uint64_t occupied = 0;
    for (size_t i = 0; i < n; ++i) {
        if (vcpus[order[i]].on_cpu >= 0) occupied |= uint64_t{1} << vcpus[order[i]].on_cpu;
    }
    assign_ranked(order, n, occupied);
}

void Sim::assign_ranked(const int* order, size_t n, uint64_t occupied) {
    uint64_t free = 0;
    for (int p = 0; p < cfg.pcpus; ++p) {
        if (cpus[p].run < 0) free |= uint64_t{1} << p;
    }
    for (size_t i = 0; i < n; ++i) {
        const int index = order[i];
        if (free == 0) break;
        const VCpu& v = vcpus[index];
        const uint64_t usable = v.spec.affinity & free;
        if (usable == 0) continue;
        int chosen;
        if (v.on_cpu >= 0 && ((usable >> v.on_cpu) & 1U)) {
            chosen = v.on_cpu;
        } else {
            const uint64_t unclaimed = usable & ~occupied;
            chosen = __builtin_ctzll(unclaimed ? unclaimed : usable);
        }
        cpus[chosen].run = index;
        free &= ~(uint64_t{1} << chosen);
    }
}

void Sim::apply_assignment(const std::vector<int>& previous) {
    // the pCPUs that change, accounted up to now with the vCPU they ran (a vCPU moving to a lower pCPU must be
    // accounted before its new pCPU plans it)
    uint64_t changed = 0;
    for (int p = 0; p < cfg.pcpus; ++p) {
        if (cpus[p].run == previous[p]) continue;
        changed |= uint64_t{1} << p;
        const int taken = cpus[p].run;
        cpus[p].run = previous[p];
        catch_up(p, now);
        cpus[p].run = taken;
    }
    // One pass: a vCPU that left pCPU p is cleared only if no lower pCPU took it already in this pass.
    for (uint64_t left = changed; left; left &= left - 1) {
        const int p = __builtin_ctzll(left);
        PCpu& c = cpus[p];
        if (previous[p] >= 0 && vcpus[previous[p]].on_cpu == p) vcpus[previous[p]].on_cpu = -1;
        if (c.run >= 0) {
            vcpus[c.run].on_cpu = p;
            c.overhead_left = c.run != c.last_run ? cfg.vm_switch : 0;
            c.last_run = c.run;
        } else {
            c.overhead_left = 0;
        }
    }
    for (uint64_t left = changed; left; left &= left - 1) plan(__builtin_ctzll(left));
    if (!gap_probes_) return;
    for (int p = 0; p < cfg.pcpus; ++p) {
        if (previous[p] < 0) continue;
        VCpu& v = vcpus[previous[p]];
        bool running = v.on_cpu >= 0 && cpus[v.on_cpu].overhead_left == 0;
        if (v.gap_running && !running) {
            v.gap_running = false;
            v.gap_since = now;
        }
    }
}

void Sim::add_supply_across(VCpu& v, Time from, Time to) {
    const Time w = cfg.supply_window;
    while (from < to) {
        if (from >= v.window_end) {  // time only moves forward: a division only when a window is left
            store_window_supply(v);
            v.window = static_cast<size_t>(from / w);
            v.window_end = static_cast<Time>(v.window + 1) * w;
        }
        Time edge = std::min(to, v.window_end);
        v.supplied += edge - from;
        from = edge;
    }
}

// The supply of the window being filled into `supply_` (when the window is left, handed over or the run ends).
void Sim::store_window_supply(VCpu& v) {
    const Time filled = v.supplied - v.window_base;
    v.window_base = v.supplied;
    if (filled == 0) return;
    // v.window >= supply_from_: take_supply() stored every window before that had supply
    std::vector<Time>& windows = supply_[static_cast<size_t>(v.index)];
    const size_t at = v.window - supply_from_;
    if (at >= windows.size()) windows.resize(at + 1, 0);
    windows[at] += filled;
}

void Sim::take_supply(SupplyColumns& out) {
    const Time w = cfg.supply_window;
    // the windows before the one `now` is in have ended; at the end, the last one too
    const size_t upto = static_cast<size_t>(ended_ ? (now + w - 1) / w : now / w);
    if (upto <= supply_from_) return;
    catch_up_all();  // the supply of the running vCPUs up to now
    for (VCpu& v : vcpus) {
        if (v.window < upto) store_window_supply(v);  // a vCPU that has not run since its window ended
    }
    const size_t count = upto - supply_from_;
    const size_t rows = count * vcpus.size();
    out.vcpu.reserve(out.vcpu.n + rows);
    out.window_start.reserve(out.window_start.n + rows);
    out.supply.reserve(out.supply.n + rows);
    for (size_t v = 0; v < vcpus.size(); ++v) {
        std::vector<Time>& windows = supply_[v];  // no window at or after `upto` has supply yet
        for (size_t i = 0; i < count; ++i) {
            out.vcpu.put(static_cast<int32_t>(v));
            out.window_start.put(static_cast<Time>(supply_from_ + i) * w);
            out.supply.put(i < windows.size() ? windows[i] : 0);
        }
        windows.clear();
    }
    supply_from_ = upto;
}

// Account pCPU p's vCPU for [since, to): switch overhead, then its job's context switch, then the job; the
// supply, the gap probe, the Gantt segments. Splitting an interval changes nothing, so a pCPU is accounted only
// when something on it changes (and at a chunk's or the run's end), not at every decision point.
void Sim::catch_up_interval(int p, Time to) {
    PCpu& c = cpus[p];
    Time t = c.since;
    c.since = to;
    if (c.run < 0) return;
    VCpu& v = vcpus[c.run];
    Time overhead = std::min(to - t, c.overhead_left);
    if (overhead > 0) {
        if (gantt_) add_segment(p, c.run, -2, t, t + overhead);
        c.overhead_left -= overhead;
        t += overhead;
    }
    if (t >= to) return;
    add_supply(v, t, to);
    if (v.spec.gap_threshold >= 0) {
        if (!v.gap_running) {
            if (v.gap_since >= 0 && t - v.gap_since >= v.spec.gap_threshold) {
                gaps.push_back(GapRecord{v.index, p, v.gap_since, t - v.gap_since});
            }
            v.gap_running = true;
        }
        if (gantt_) add_segment(p, c.run, -1, t, to);
        return;
    }
    if (v.ready.empty()) {
        if (gantt_) add_segment(p, c.run, -3, t, to);
        return;
    }
    Job& job = v.ready.top();
    Time cs = std::min(to - t, v.cs_left);
    if (cs > 0) {
        if (gantt_) add_segment(p, c.run, -2, t, t + cs);
        v.cs_left -= cs;
        t += cs;
    }
    if (t < to) {
        if (job.start < 0) job.start = t;
        job.remaining -= to - t;
        if (gantt_) add_segment(p, c.run, job.task, t, to);
    }
}

void Sim::catch_up_all() {
    for (int p = 0; p < cfg.pcpus; ++p) catch_up(p, now);
}

// When pCPU p (accounted up to now) finishes its vCPU's job at the head of the ready queue: a job new to the
// vCPU first pays the context switch.
void Sim::plan(int p) {
    PCpu& c = cpus[p];
    c.due = NEVER;
    if (c.run < 0) return;
    VCpu& v = vcpus[c.run];
    if (v.spec.gap_threshold >= 0 || v.ready.empty()) return;
    const Job& job = v.ready.top();
    if (job.seq != v.last_job) {
        v.last_job = job.seq;
        v.cs_left = cfg.context_switch;
    }
    c.due = c.since + c.overhead_left + v.cs_left + job.remaining;
}

void Sim::add_segment(int cpu, int vcpu, int task, Time from, Time to) {
    if (to <= cfg.gantt_from || from >= cfg.gantt_to) return;
    from = std::max(from, cfg.gantt_from);
    to = std::min(to, cfg.gantt_to);
    int64_t open = gantt_open_[cpu];
    if (open >= 0) {
        Segment& last = segments[static_cast<size_t>(open)];
        if (last.end == from && last.vcpu == vcpu && last.task == task) {
            last.end = to;
            return;
        }
    }
    if (segments.size() >= MAX_SEGMENTS) return;
    gantt_open_[cpu] = static_cast<int64_t>(segments.size());
    segments.push_back(Segment{cpu, vcpu, task, from, to});
}

void Sim::start() {
    started_ = true;
    hv->init(*this);
    double expected = 0;
    for (const TaskSpec& task : cfg.tasks) {
        Time gap = task.type == PERIODIC ? task.period : task.type == SPORADIC ? task.min_ia : 0;
        if (gap > 0 && task.record) expected += static_cast<double>(cfg.duration) / static_cast<double>(gap);
    }
    for (const ChainSpec& chain : cfg.chains) {
        double events_expected = static_cast<double>(cfg.duration) / static_cast<double>(chain.period);
        expected += events_expected * static_cast<double>(chain.stages.size());
        chain_records.reserve(chain_records.capacity() + static_cast<size_t>(std::min(events_expected, 4e6)));
    }
    expected_jobs_ = static_cast<size_t>(std::min(expected + 16, 1e12));
    for (size_t t = 0; t < cfg.tasks.size(); ++t) {
        if (cfg.tasks[t].type != EVENT) schedule_next_arrival(static_cast<int>(t), cfg.tasks[t].offset);
    }
    for (size_t c = 0; c < cfg.chains.size(); ++c) {
        const ChainSpec& chain = cfg.chains[c];
        push(chain.offset + (chain.jitter ? rng_.uniform(0, chain.jitter) : 0), 0, EV_CHAIN, static_cast<int>(c),
             0, chain.offset);
    }
    resched_ = true;
}

// The job at the head of `v`'s ready queue, running on `cpu`, has just finished.
void Sim::complete(VCpu& v, int cpu) {
    const Job& job = v.ready.top();  // popped at the end: nothing below touches the ready queue
    ++jobs_done;
    const TaskSpec& task = cfg.tasks[job.task];
    if (task.record) {
        jobs.push(job, now, cpu);
        TaskStats& stats = task_stats[static_cast<size_t>(job.task)];
        Time response = now - job.arrival;
        ++stats.jobs;
        stats.response_sum += response;
        stats.response_max = std::max(stats.response_max, response);
        if (now > job.deadline) ++stats.misses;
    }
    if (task.chain >= 0) {
        const ChainSpec& chain = cfg.chains[task.chain];
        if (task.stage + 1 < static_cast<int>(chain.stages.size())) {
            push(now + cfg.interrupt_delay, 1, EV_STAGE, chain.stages[task.stage + 1], job.event, job.event_arrival);
        } else {
            chain_records.push_back(ChainRecord{task.chain, cpu, job.event, job.event_arrival, now});
        }
    }
    v.ready.pop();
    if (v.ready.empty()) {
        hv->block(*this, v, now);
        resched_ = true;
    }
}

bool Sim::advance(size_t rows) {
    if (!started_) start();
    if (ended_) return true;
    // reserve the chunk up front: no reallocation while running
    jobs.reserve(std::min(rows, expected_jobs_));
    const Time end = cfg.duration;
    while (now < end) {  // the run covers [0, duration): nothing is released at `end` itself
        while (!queue_.empty() && queue_.top().t <= now) {
            const Event e = queue_.top();
            ++events;
            if (e.kind == EV_RELEASE) {
                const TaskSpec& task = cfg.tasks[e.index];
                release(e.index, e.b, e.t, -1, 0);
                Time nominal = e.b + (task.type == SPORADIC ? rng_.uniform(task.min_ia, task.max_ia) : task.period);
                Time jitter = task.jitter ? rng_.uniform(0, task.jitter) : 0;
                queue_.replace_top(
                    Event{nominal + jitter, Event::order_of(1, seq_++), EV_RELEASE, e.index, 0, nominal});
            } else if (e.kind == EV_CHAIN) {
                const ChainSpec& chain = cfg.chains[e.index];
                Event stage{e.t + cfg.interrupt_delay, Event::order_of(1, seq_++), EV_STAGE, chain.stages[0], e.a,
                            e.t};
                Time nominal = e.b + chain.period;
                queue_.replace_top(Event{nominal + (chain.jitter ? rng_.uniform(0, chain.jitter) : 0),
                                         Event::order_of(0, seq_++), EV_CHAIN, e.index, e.a + 1, nominal});
                queue_.push(stage);
            } else {
                queue_.pop();
                release(e.index, e.t, e.t, e.a, e.b);
            }
        }
        if (events + steps > cfg.event_cap) {
            end_reason = "event-cap";
            break;
        }
        if ((steps & 0xFFFFF) == 0 && interrupted && interrupted()) {
            end_reason = "interrupted";
            break;
        }
        if (resched_) {
            for (int p = 0; p < cfg.pcpus; ++p) {
                previous_[p] = cpus[p].run;
                cpus[p].run = -1;
            }
            hv_next_ = hv->pick(*this, now);
            // a scheduler asking to be called again "now" would spin in place; its timers lie in the future
            if (hv_next_ <= now) hv_next_ = now + 1;
            apply_assignment(previous_);
            resched_ = false;
        }
        Time next = std::min(end, hv_next_);
        if (!queue_.empty()) next = std::min(next, queue_.top().t);
        if (cfg.quantum > 0) next = std::min(next, (now / cfg.quantum + 1) * cfg.quantum);
        for (const PCpu& c : cpus) next = std::min(next, c.due);
        ++steps;
        // pCPUs whose job is done at `next`: completed after accounting, in pCPU order
        uint64_t done = 0;
        for (int p = 0; p < cfg.pcpus; ++p) {
            if (cpus[p].due == next) done |= uint64_t{1} << p;
        }
        if (eager_) {
            for (int p = 0; p < cfg.pcpus; ++p) catch_up(p, next);
        }
        hv->account(*this, now, next);
        if (next >= hv_next_) resched_ = true;
        now = next;
        if (cfg.quantum > 0 && now % cfg.quantum == 0) resched_ = true;
        for (; done; done &= done - 1) {
            const int p = __builtin_ctzll(done);
            catch_up(p, now);
            complete(vcpus[cpus[p].run], p);
            plan(p);
        }
        if (jobs.size() >= rows) return false;
    }
    finish();
    return true;
}

void Sim::finish() {
    ended_ = true;
    catch_up_all();
    for (VCpu& v : vcpus) store_window_supply(v);
    for (const VCpu& v : vcpus) {
        for (const ReadyQueue::Entry& entry : v.ready.heap) {
            const Job& job = v.ready.slots[entry.slot];
            if (cfg.tasks[job.task].record) {
                unfinished.push_back(JobRecord{job.arrival, job.release, job.start, -1, job.deadline, job.task, -1, job.event});
            }
        }
    }
}

}  // namespace rtv
