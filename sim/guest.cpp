// Guest schedulers: each is the order of a vCPU's ready queue (ties go to the earlier job, as SCHED_FIFO
// queues equal priorities). Background load jobs sort after every recorded task under fp.
#include <stdexcept>

#include "core.h"

namespace rtv {

static Time fixed_priority(const TaskSpec& task, const Job&) { return task.record ? -task.priority : 1; }
static Time earliest_deadline(const TaskSpec&, const Job& job) { return job.deadline; }
static Time first_in_first_out(const TaskSpec&, const Job&) { return 0; }  // release order, never preempted

const std::vector<GuestEntry>& guest_registry() {
    static const std::vector<GuestEntry> table = {
        {"fp", fixed_priority},
        {"edf", earliest_deadline},
        {"fifo", first_in_first_out},
    };
    return table;
}

int guest_index(const std::string& name) {
    const auto& table = guest_registry();
    for (size_t i = 0; i < table.size(); ++i) {
        if (name == table[i].name) return static_cast<int>(i);
    }
    throw std::invalid_argument("unknown guest scheduler: " + name);
}

}  // namespace rtv
