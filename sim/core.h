// rtvirt hierarchical scheduling simulator core (docs/simulator.md).
//
// A discrete-event loop in the style of SimPy: an event queue ordered by (time, priority, sequence) holds
// releases and event-chain arrivals; between two decision points nothing changes, so the loop jumps straight
// to the next one (an event, a job completion, or a timer the hypervisor scheduler asked for). Hypervisor
// schedulers plug in through HvScheduler (one file each under hv/, listed in registry.cpp); guest schedulers
// are the ready-queue orders in guest.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rtv {

using Time = int64_t;
constexpr Time NEVER = INT64_MAX / 4;
constexpr size_t MAX_SEGMENTS = 200000;  // a Gantt chart beyond this is unreadable anyway

// splitmix64: small, fast and fully determined by the seed (results must repeat exactly).
struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed) : state(seed) {}
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    Time uniform(Time lo, Time hi) {  // inclusive
        if (hi <= lo) return lo;
        return lo + static_cast<Time>(next() % static_cast<uint64_t>(hi - lo + 1));
    }
    double unit() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
    double normal();
};

enum TaskType { PERIODIC = 0, SPORADIC = 1, EVENT = 2 };
enum Distribution { FIXED = 0, UNIFORM = 1, NORMAL = 2 };
enum GuestPolicy { GUEST_FP = 0, GUEST_EDF = 1, GUEST_FIFO = 2 };

struct TaskSpec {
    int vcpu = 0;
    int type = PERIODIC;
    Time period = 0, min_ia = 0, max_ia = 0, offset = 0, jitter = 0;
    int dist = FIXED;
    Time exec = 0, emin = 0, emax = 0, emean = 0, estdev = 0;
    int priority = 0;
    Time deadline = NEVER;  // relative
    bool record = true;     // background load jobs are simulated but not recorded
    int chain = -1, stage = -1;
};

struct Window {
    Time start, length;
};

struct VCpuSpec {
    int vm = 0;
    int home = 0;
    uint64_t affinity = 1;  // bit mask of allowed pCPUs
    int priority = 0;
    Time budget = 0, period = 0, slice = 0, runtime = 0, deadline = 0;
    bool extratime = false, rt = false;
    int weight = 256;
    double cap = 0;
    std::vector<Window> windows;
    Time gap_threshold = -1;  // >= 0: a gap probe spins on this vCPU at top priority
};

struct ChainSpec {
    Time period = 0, jitter = 0, offset = 0, deadline = NEVER;
    std::vector<int> stages;  // task indices
};

struct Config {
    Time duration = 0;
    uint64_t seed = 1;
    int64_t event_cap = 0;
    Time supply_window = 10000000;
    std::string scheduler, server = "none", mode = "global";
    int pcpus = 1;
    Time quantum = 0, context_switch = 0, vm_switch = 0, interrupt_delay = 0;
    Time credit_slice = 30000000, credit_accounting = 10000000, credit_rate_limit = 1000000;
    Time fair_slice = 4000000, major_frame = 0;
    // Budgets checked only at a periodic tick (Linux SCHED_DEADLINE without HRTICK_DL): ticks at
    // enforcement_phase + k * enforcement_tick; 0 = budgets are enforced exactly. A replenished reservation
    // resumes after a wake-up latency drawn uniformly from [0, resume_jitter], or, when resume_latencies is
    // not empty, drawn from those values with equal chance (a measured distribution's quantiles).
    Time enforcement_tick = 0, enforcement_phase = 0, resume_jitter = 0;
    std::vector<Time> resume_latencies;
    std::vector<int> guest;  // per VM
    std::vector<VCpuSpec> vcpus;
    std::vector<TaskSpec> tasks;
    std::vector<ChainSpec> chains;
    Time gantt_from = 0, gantt_to = 0;
};

struct Job {
    int task;
    uint64_t seq;
    Time arrival, release, deadline, remaining, start = -1;
    int64_t event = -1;
    Time event_arrival = 0;
    Time key = 0;  // guest ready-queue order: smaller first, then seq
};

// Ready queue of one vCPU: a binary heap ordered by (key, seq) of small entries pointing at job slots, so a
// sift moves 24 bytes instead of a whole Job.
struct ReadyQueue {
    struct Entry {
        Time key;
        uint64_t seq;
        uint32_t slot;
        bool operator>(const Entry& o) const { return key != o.key ? key > o.key : seq > o.seq; }
    };
    std::vector<Entry> heap;
    std::vector<Job> slots;
    std::vector<uint32_t> free_slots;
    bool empty() const { return heap.empty(); }
    const Job& top() const { return slots[heap.front().slot]; }
    Job& top() { return slots[heap.front().slot]; }
    // A slot for a new job, which the caller fills in place (no Job built and copied), then queue()s.
    uint32_t claim();
    void queue(uint32_t slot);
    void pop();
};

struct VCpu {
    VCpuSpec spec;
    int index = 0;
    ReadyQueue ready;
    int on_cpu = -1;  // pCPU currently running this vCPU (its code), -1 if none
    uint64_t last_job = 0;
    Time cs_left = 0;
    bool gap_running = false;
    Time gap_since = -1;
    Time supplied = 0;
    size_t window = 0;    // supply window being filled, where it ends, and `supplied` when it began (its supply
    Time window_end = 0;  // is stored when the window is left: one add per running pCPU and decision point)
    Time window_base = 0;
    // state shared by the budget-based schedulers (each keeps anything else in its own tables)
    Time q = 0;             // budget / slice / runtime left
    Time dl = 0;            // absolute deadline or end of the current period
    Time next_repl = 0;     // next replenishment
    Time period_start = 0;
    Time blocked_at = -1;   // last time it ran out of work
    int64_t stamp = 0;      // round-robin order
    bool has_work() const { return spec.gap_threshold >= 0 || !ready.empty(); }
};

struct PCpu {
    int run = -1;       // vCPU whose code runs here, -1 idle
    int last_run = -1;  // last vCPU that ran here (switch overhead)
    Time overhead_left = 0;
    Time since = 0;     // accounted up to here (Sim::catch_up)
    Time due = NEVER;   // when the job running here finishes if nothing changes (Sim::plan)
};

struct JobRecord {
    Time arrival, release, start, finish, deadline;
    int32_t task;
    int32_t cpu;
    int64_t event;
};
// One column of finished jobs: put is a store and an increment (std::vector::push_back of int16 was not
// inlined into the step loop: 46 instructions a job), JobColumns checks the room of all columns at once;
// module.cpp hands the buffer to numpy without a copy.
template <class T>
struct Column {
    std::unique_ptr<T[]> data;
    size_t n = 0, cap = 0;
    void reserve(size_t want) {
        if (want > cap) grow(want);
    }
    void put(T value) { data[n++] = value; }  // the caller made room
    void grow(size_t want) {  // new T[] of a trivial type leaves it uninitialised: no zero-fill pass
        std::unique_ptr<T[]> bigger(new T[want]);
        if (n) std::copy(data.get(), data.get() + n, bigger.get());
        data = std::move(bigger);
        cap = want;
    }
};
// Finished jobs of one chunk, as columns close to the stored layout (docs/simulator.md): they go to Python as
// numpy arrays without another copy. release and event are kept only when they can differ from arrival / -1
// (a task with release jitter, a model with chains): otherwise they would be columns of copies.
struct JobColumns {
    Column<Time> arrival, response, start, release, event;
    Column<int16_t> task, cpu;
    bool with_release = true, with_event = true;
    size_t size() const { return task.n; }
    void reserve(size_t n) {
        arrival.reserve(n);
        response.reserve(n);
        start.reserve(n);
        if (with_release) release.reserve(n);
        if (with_event) event.reserve(n);
        task.reserve(n);
        cpu.reserve(n);
    }
    void push(const Job& job, Time finish, int p) {
        // the columns kept grow together (reserve): the task column's room is every column's room
        if (__builtin_expect(task.n == task.cap, 0)) reserve(task.cap * 2 + 1024);
        arrival.put(job.arrival);
        response.put(finish - job.arrival);
        start.put(job.start);
        if (with_release) release.put(job.release);
        if (with_event) event.put(job.event);
        task.put(static_cast<int16_t>(job.task));
        cpu.put(static_cast<int16_t>(p));
    }
};
// Supply of the windows handed over at once, vCPU-major (the stored supply.parquet's row group).
struct SupplyColumns {
    Column<int32_t> vcpu;
    Column<Time> window_start, supply;
};
// Per task, over every finished job: the summary `rtvirt sim` prints, counted while simulating.
struct TaskStats {
    int64_t jobs = 0, misses = 0;
    Time response_sum = 0, response_max = -1;
};
struct ChainRecord {
    int32_t chain;
    int32_t cpu;  // where the last stage finished
    int64_t event;
    Time arrival, finish;
};
struct GapRecord {
    int32_t vcpu, cpu;
    Time start, length;
};
struct Segment {
    int32_t cpu, vcpu, task;  // task -1: gap probe spinning, -2: switch overhead, -3: idle holder
    Time start, end;
};

class Sim;

// A hypervisor scheduler. pick() assigns vCPUs to pCPUs (Sim::cpus[p].run) and returns the next time it must
// be asked again even if nothing else happens (budget exhaustion, replenishment, slice or window end).
// account() charges the interval [from, to) in which that assignment ran, then fires its timers due at `to`.
struct HvScheduler {
    virtual ~HvScheduler() = default;
    virtual void init(Sim&) {}
    virtual void wake(Sim&, VCpu&, Time) {}
    virtual void block(Sim&, VCpu&, Time) {}
    virtual Time pick(Sim& sim, Time now) = 0;
    virtual void account(Sim&, Time, Time) {}
};

using HvFactory = std::function<std::unique_ptr<HvScheduler>(const Config&)>;
struct HvEntry {
    const char* name;
    HvFactory make;
};
const std::vector<HvEntry>& hv_registry();
struct GuestEntry {
    const char* name;
    Time (*key)(const TaskSpec& task, const Job& job);  // ready-queue order: smaller runs first
};
const std::vector<GuestEntry>& guest_registry();
int guest_index(const std::string& name);

struct Event {
    Time t;
    uint64_t order;  // priority (bits 62-63), then sequence: one comparison after the time (a smaller sift)
    int kind;
    int index;
    int64_t a;
    Time b;
    static uint64_t order_of(int prio, uint64_t seq) { return static_cast<uint64_t>(prio) << 62 | seq; }
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

// Binary min-heap of events. replace_top() re-arms the event just handled (a task's next arrival, a chain's
// next event) with one sift instead of a pop and a push; the order is the same, (t, order) being unique.
class EventQueue {
public:
    bool empty() const { return heap_.empty(); }
    const Event& top() const { return heap_.front(); }
    void push(const Event& e) {
        heap_.push_back(e);
        std::push_heap(heap_.begin(), heap_.end(), std::greater<Event>());
    }
    void pop() {
        std::pop_heap(heap_.begin(), heap_.end(), std::greater<Event>());
        heap_.pop_back();
    }
    void replace_top(const Event& e) {
        const size_t n = heap_.size();
        size_t i = 0;
        for (;;) {
            size_t c = 2 * i + 1;
            if (c >= n) break;
            if (c + 1 < n && heap_[c] > heap_[c + 1]) ++c;
            if (!(e > heap_[c])) break;
            heap_[i] = heap_[c];
            i = c;
        }
        heap_[i] = e;
    }

private:
    std::vector<Event> heap_;
};

class Sim {
public:
    explicit Sim(Config config);
    // Simulate until `rows` finished jobs are in `jobs` (the caller takes them away between calls) or the run
    // ends; true once it has ended (then `unfinished` holds the jobs still queued).
    bool advance(size_t rows);
    // End the run where it is (an interruption that reached Python between two advance() calls).
    void stop(const std::string& reason) {
        if (ended_) return;
        end_reason = reason;
        finish();
    }

    Config cfg;
    std::vector<VCpu> vcpus;
    std::vector<PCpu> cpus;
    std::unique_ptr<HvScheduler> hv;
    Time now = 0;

    JobColumns jobs;
    std::vector<TaskStats> task_stats;
    std::vector<JobRecord> unfinished;  // jobs still queued when the run ended (finish = -1)
    std::vector<ChainRecord> chain_records;
    std::vector<GapRecord> gaps;
    std::vector<Segment> segments;
    // The supply of every window that has ended and was not handed over yet, vCPU-major (a window ends for
    // every vCPU at once, so the windows come out in blocks: written while the simulation goes on).
    void take_supply(SupplyColumns& out);
    int64_t steps = 0, events = 0, jobs_done = 0;
    std::function<bool()> interrupted;  // polled now and then; true ends the run early ("interrupted")
    std::string end_reason = "complete";

    // helpers for schedulers
    bool cpu_free(int p) const { return cpus[p].run < 0; }
    bool any_cpu_idle() const;
    // Place vCPUs (best first) on pCPUs they may use, keeping each on its current pCPU when possible.
    void assign_ranked(const int* order, size_t n);
    // the same, given the pCPUs the ranked vCPUs run on now (a scheduler that ranks them has that mask at hand)
    void assign_ranked(const int* order, size_t n, uint64_t occupied);
    void assign_ranked(const std::vector<int>& order) { assign_ranked(order.data(), order.size()); }

private:
    EventQueue queue_;
    uint64_t seq_ = 0, job_seq_ = 0;
    bool resched_ = true, started_ = false, ended_ = false;
    Time hv_next_ = 0;
    std::vector<std::vector<Time>> supply_;  // per vCPU, per supply window from supply_from_ on
    size_t supply_from_ = 0;                 // first window not handed over yet
    std::vector<int> previous_;  // assignment before the last pick
    size_t expected_jobs_ = 0;   // recorded jobs the run will have, roughly: sizes the chunk buffers
    std::vector<Time (*)(const TaskSpec&, const Job&)> guest_keys_;  // per VM
    int64_t gantt_open_[64] = {};
    bool gantt_ = false;  // a Gantt window was asked for
    bool gap_probes_ = false;  // a vCPU runs a gap probe (else apply_assignment has no gap to close)
    // account every pCPU at every decision point: a Gantt chart's segments come out in time order, and the
    // gap probes' bookkeeping in apply_assignment reads every pCPU's overhead
    bool eager_ = false;

    void push(Time t, int prio, int kind, int index, int64_t a = 0, Time b = 0);
    void start();
    void finish();
    void complete(VCpu& v, int cpu);
    Time draw_exec(const TaskSpec& task);
    void release(int task, Time arrival, Time release, int64_t event, Time event_arrival);
    void schedule_next_arrival(int task, Time nominal);
    void apply_assignment(const std::vector<int>& previous);
    // Count [from, to) as supplied to `v`; inline for the usual case of an interval inside the window being
    // filled (one per running pCPU and decision point), the rest out of line.
    void add_supply(VCpu& v, Time from, Time to) {
        if (to <= v.window_end) {  // from >= the window's start: time only moves forward
            v.supplied += to - from;
        } else {
            add_supply_across(v, from, to);
        }
    }
    void add_supply_across(VCpu& v, Time from, Time to);
    void catch_up(int p, Time to) {  // inline: most calls find the pCPU accounted already (a second change at once)
        if (cpus[p].since < to) catch_up_interval(p, to);
    }
    void catch_up_interval(int p, Time to);
    void catch_up_all();
    void plan(int p);
    void store_window_supply(VCpu& v);
    void add_segment(int cpu, int vcpu, int task, Time from, Time to);
    Rng rng_;
};

}  // namespace rtv
