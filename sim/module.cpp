// Python binding: rtvirt._simcore.Simulation(config: dict), run in chunks of numpy columns (see rtvirt/sim/core.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core.h"
#include "histogram.h"

namespace py = pybind11;
using namespace rtv;

namespace {

template <class T>
T get(const py::dict& d, const char* key, T fallback) {
    return d.contains(key) ? d[key].cast<T>() : fallback;
}

Config to_config(const py::dict& d) {
    Config c;
    c.duration = d["duration"].cast<Time>();
    c.seed = get<uint64_t>(d, "seed", 1);
    c.event_cap = get<int64_t>(d, "event_cap", INT64_MAX / 2);
    c.supply_window = get<Time>(d, "supply_window", 10000000);
    c.scheduler = d["scheduler"].cast<std::string>();
    c.server = get<std::string>(d, "server", "none");
    c.mode = get<std::string>(d, "mode", "global");
    c.pcpus = get<int>(d, "pcpus", 1);
    c.quantum = get<Time>(d, "quantum", 0);
    c.context_switch = get<Time>(d, "context_switch", 0);
    c.vm_switch = get<Time>(d, "vm_switch", 0);
    c.interrupt_delay = get<Time>(d, "interrupt_delay", 0);
    c.credit_slice = get<Time>(d, "credit_slice", c.credit_slice);
    c.credit_accounting = get<Time>(d, "credit_accounting", c.credit_accounting);
    c.credit_rate_limit = get<Time>(d, "credit_rate_limit", c.credit_rate_limit);
    c.fair_slice = get<Time>(d, "fair_slice", c.fair_slice);
    c.major_frame = get<Time>(d, "major_frame", 0);
    c.enforcement_tick = get<Time>(d, "enforcement_tick", 0);
    c.enforcement_phase = get<Time>(d, "enforcement_phase", 0);
    c.resume_jitter = get<Time>(d, "resume_jitter", 0);
    c.resume_latencies = get<std::vector<Time>>(d, "resume_latencies", {});
    c.gantt_from = get<Time>(d, "gantt_from", 0);
    c.gantt_to = get<Time>(d, "gantt_to", 0);
    for (auto name : d["guest"].cast<py::list>()) c.guest.push_back(guest_index(name.cast<std::string>()));
    for (auto item : d["vcpus"].cast<py::list>()) {
        py::dict v = item.cast<py::dict>();
        VCpuSpec s;
        s.vm = v["vm"].cast<int>();
        s.home = get<int>(v, "home", 0);
        s.affinity = get<uint64_t>(v, "affinity", 1);
        s.priority = get<int>(v, "priority", 0);
        s.budget = get<Time>(v, "budget", 0);
        s.period = get<Time>(v, "period", 0);
        s.slice = get<Time>(v, "slice", 0);
        s.runtime = get<Time>(v, "runtime", 0);
        s.deadline = get<Time>(v, "deadline", 0);
        s.extratime = get<bool>(v, "extratime", false);
        s.rt = get<bool>(v, "rt", false);
        s.weight = get<int>(v, "weight", 256);
        s.cap = get<double>(v, "cap", 0);
        s.gap_threshold = get<Time>(v, "gap_threshold", -1);
        for (auto w : get<py::list>(v, "windows", py::list())) {
            auto pair = w.cast<std::pair<Time, Time>>();
            s.windows.push_back(Window{pair.first, pair.second});
        }
        if (s.vm < 0 || s.vm >= static_cast<int>(c.guest.size()) || s.home < 0 || s.home >= c.pcpus)
            throw std::invalid_argument("vcpu refers to a missing VM or pCPU");
        c.vcpus.push_back(std::move(s));
    }
    for (auto item : d["tasks"].cast<py::list>()) {
        py::dict t = item.cast<py::dict>();
        TaskSpec s;
        s.vcpu = t["vcpu"].cast<int>();
        s.type = get<int>(t, "type", PERIODIC);
        s.period = get<Time>(t, "period", 0);
        s.min_ia = get<Time>(t, "min_ia", 0);
        s.max_ia = get<Time>(t, "max_ia", 0);
        s.offset = get<Time>(t, "offset", 0);
        s.jitter = get<Time>(t, "jitter", 0);
        s.dist = get<int>(t, "dist", FIXED);
        s.exec = get<Time>(t, "exec", 0);
        s.emin = get<Time>(t, "emin", 0);
        s.emax = get<Time>(t, "emax", 0);
        s.emean = get<Time>(t, "emean", 0);
        s.estdev = get<Time>(t, "estdev", 0);
        s.priority = get<int>(t, "priority", 0);
        s.deadline = get<Time>(t, "deadline", NEVER);
        s.record = get<bool>(t, "record", true);
        s.chain = get<int>(t, "chain", -1);
        s.stage = get<int>(t, "stage", -1);
        c.tasks.push_back(s);
    }
    for (auto item : d["chains"].cast<py::list>()) {
        py::dict ch = item.cast<py::dict>();
        ChainSpec s;
        s.period = ch["period"].cast<Time>();
        s.jitter = get<Time>(ch, "jitter", 0);
        s.offset = get<Time>(ch, "offset", 0);
        s.deadline = get<Time>(ch, "deadline", NEVER);
        s.stages = ch["stages"].cast<std::vector<int>>();
        c.chains.push_back(std::move(s));
    }
    return c;
}

template <class Rec, class Field>
py::array_t<Field> column(const std::vector<Rec>& records, Field Rec::*member) {
    py::array_t<Field> out(static_cast<py::ssize_t>(records.size()));
    auto view = out.template mutable_unchecked<1>();
    for (size_t i = 0; i < records.size(); ++i) view(static_cast<py::ssize_t>(i)) = records[i].*member;
    return out;
}

// A numpy array owning the vector's buffer (no copy).
template <class T>
py::array_t<T> adopt(std::vector<T>&& values) {
    auto* owned = new std::vector<T>(std::move(values));
    py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
    return py::array_t<T>(static_cast<py::ssize_t>(owned->size()), owned->data(), free_when_done);
}

// A numpy array owning the column's buffer (no copy); the column starts empty again.
template <class T>
py::array_t<T> adopt(Column<T>& column) {
    if (!column.data) return py::array_t<T>(0);  // never reserved (advance after the end): a capsule needs a pointer
    T* owned = column.data.release();
    py::capsule free_when_done(owned, [](void* p) { delete[] static_cast<T*>(p); });
    py::array_t<T> out(static_cast<py::ssize_t>(column.n), owned, free_when_done);
    column.n = column.cap = 0;
    return out;
}

// One simulation, run in chunks: advance() hands over the jobs finished so far while the caller (rtvirt.sim)
// writes the previous chunk in another thread; results() returns everything else once the run has ended.
class Simulation {
public:
    explicit Simulation(const py::dict& config) : sim_(to_config(config)) {
        sim_.interrupted = [] {  // Ctrl-C / SIGTERM: stop and hand back what was simulated so far
            py::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() == 0) return false;
            PyErr_Clear();
            return true;
        };
    }

    // (jobs finished since the last call as numpy columns, the supply of the windows ended meanwhile, whether
    // the run has ended)
    py::tuple advance(size_t rows) {
        bool ended;
        {
            py::gil_scoped_release unlocked;
            ended = sim_.advance(std::max<size_t>(rows, 1));
        }
        JobColumns& j = sim_.jobs;
        py::dict chunk;
        chunk["arrival"] = adopt(j.arrival);
        chunk["response"] = adopt(j.response);
        chunk["start"] = adopt(j.start);
        if (j.with_release) chunk["release"] = adopt(j.release);
        if (j.with_event) chunk["event"] = adopt(j.event);
        chunk["task"] = adopt(j.task);
        chunk["cpu"] = adopt(j.cpu);
        return py::make_tuple(chunk, supply(), ended);
    }

    // Supply of the windows not handed over yet that have ended (all of them once the run has ended).
    py::dict supply() {
        SupplyColumns columns;
        sim_.take_supply(columns);
        py::dict out;
        out["vcpu"] = adopt(columns.vcpu);
        out["window_start"] = adopt(columns.window_start);
        out["supply"] = adopt(columns.supply);
        return out;
    }

    void stop() { sim_.stop("interrupted"); }

    py::dict results() {
        Sim& sim = sim_;
        py::dict out;
        py::dict stats;
        stats["jobs"] = column(sim.task_stats, &TaskStats::jobs);
        stats["misses"] = column(sim.task_stats, &TaskStats::misses);
        stats["response_sum"] = column(sim.task_stats, &TaskStats::response_sum);
        stats["response_max"] = column(sim.task_stats, &TaskStats::response_max);
        out["task_stats"] = stats;
        py::dict pending;
        pending["task"] = column(sim.unfinished, &JobRecord::task);
        pending["deadline"] = column(sim.unfinished, &JobRecord::deadline);
        out["unfinished"] = pending;
        py::dict chains;
        chains["chain"] = column(sim.chain_records, &ChainRecord::chain);
        chains["event"] = column(sim.chain_records, &ChainRecord::event);
        chains["cpu"] = column(sim.chain_records, &ChainRecord::cpu);
        chains["arrival"] = column(sim.chain_records, &ChainRecord::arrival);
        chains["finish"] = column(sim.chain_records, &ChainRecord::finish);
        out["chains"] = chains;
        py::dict gaps;
        gaps["vcpu"] = column(sim.gaps, &GapRecord::vcpu);
        gaps["cpu"] = column(sim.gaps, &GapRecord::cpu);
        gaps["start"] = column(sim.gaps, &GapRecord::start);
        gaps["length"] = column(sim.gaps, &GapRecord::length);
        out["gaps"] = gaps;
        py::dict segments;
        segments["cpu"] = column(sim.segments, &Segment::cpu);
        segments["vcpu"] = column(sim.segments, &Segment::vcpu);
        segments["task"] = column(sim.segments, &Segment::task);
        segments["start"] = column(sim.segments, &Segment::start);
        segments["end"] = column(sim.segments, &Segment::end);
        out["segments"] = segments;
        out["segments_truncated"] = sim.segments.size() >= MAX_SEGMENTS;
        out["supply"] = supply();  // the windows advance() has not handed over (a run stopped in between)
        std::vector<Time> supplied;
        for (const VCpu& v : sim.vcpus) supplied.push_back(v.supplied);
        out["supplied"] = supplied;
        out["end_time"] = sim.now;
        out["end_reason"] = sim.end_reason;
        out["steps"] = sim.steps;
        out["events"] = sim.events;
        out["jobs_done"] = sim.jobs_done;
        return out;
    }

private:
    Sim sim_;
};

// Exact histograms per (cpu, kind) of the stored values, fed chunk by chunk (see histogram.h).
class Histograms {
public:
    void add(const py::array_t<int64_t, py::array::c_style>& values, const py::array_t<int16_t, py::array::c_style>& cpu,
             const py::array_t<int16_t, py::array::c_style>& kind) {
        if (cpu.size() != values.size() || kind.size() != values.size())
            throw std::invalid_argument("values, cpu and kind differ in length");
        const int64_t* v = values.data();
        const int16_t* c = cpu.data();
        const int16_t* k = kind.data();
        py::gil_scoped_release unlocked;
        counts_.add(v, c, k, static_cast<size_t>(values.size()));
    }

    py::dict entries() const {
        GroupHistograms::Entries found;
        {
            py::gil_scoped_release unlocked;  // sorting: the writer thread's side files go on meanwhile
            found = counts_.entries();
        }
        py::dict out;
        out["cpu"] = adopt(std::move(found.cpu));
        out["kind_index"] = adopt(std::move(found.kind_index));
        out["kinds"] = adopt(std::move(found.kinds));
        out["value"] = adopt(std::move(found.value));
        out["count"] = adopt(std::move(found.count));
        out["kind_value"] = adopt(std::move(found.kind_value));
        out["kind_count"] = adopt(std::move(found.kind_count));
        out["kind_offsets"] = adopt(std::move(found.kind_offsets));
        out["all_value"] = adopt(std::move(found.all_value));
        out["all_count"] = adopt(std::move(found.all_count));
        return out;
    }

private:
    GroupHistograms counts_;
};

}  // namespace

PYBIND11_MODULE(_simcore, m) {
    m.doc() = "rtvirt hierarchical scheduling simulator core";
    py::class_<Simulation>(m, "Simulation")
        .def(py::init<const py::dict&>(), py::arg("config"))
        .def("advance", &Simulation::advance, py::arg("rows"),
             "Simulate until `rows` jobs finished or the end: (jobs, supply of the windows ended, ended)")
        .def("stop", &Simulation::stop, "End the run as interrupted (Ctrl-C seen between two chunks)")
        .def("results", &Simulation::results, "Everything but the jobs, once advance() reported the end");
    py::class_<Histograms>(m, "Histograms")
        .def(py::init<>())
        .def("add", &Histograms::add, py::arg("values"), py::arg("cpu"), py::arg("kind"),
             "Count int64 values per (cpu, kind) group")
        .def("entries", &Histograms::entries,
             "cpu, kind_index (into kinds, the kind codes present), value, count sorted by kind, value, cpu; per kind its values summed "
             "over the CPUs (kind_value, kind_count at kind_offsets); all_value, all_count pooled");
    std::vector<std::string> hv, guest;
    for (const auto& e : hv_registry()) hv.emplace_back(e.name);
    for (const auto& e : guest_registry()) guest.emplace_back(e.name);
    m.attr("HV_SCHEDULERS") = hv;
    m.attr("GUEST_SCHEDULERS") = guest;
}
