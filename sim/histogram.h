// Exact histograms of the stored records' values per (cpu, kind) group, counted in one open-addressing hash
// table. rtvirt.sim feeds it each chunk of records from the thread that writes the chunk (the GIL released),
// so the counting runs beside the simulation instead of after it (docs/simulator.md).
#pragma once

#include <cstddef>
#include <climits>
#include <cstdint>
#include <vector>

namespace rtv {

class GroupHistograms {
public:
    GroupHistograms() : slots_(1024) {}
    void add(const int64_t* values, const int16_t* cpu, const int16_t* kind, size_t n);
    // Every (cpu, kind, value, count), sorted by kind, value, cpu; and the pooled histogram of every group
    // (distinct values ascending, their total counts: the statistics of "all").
    void entries(std::vector<int16_t>& cpu, std::vector<int16_t>& kind, std::vector<int64_t>& value,
                 std::vector<int64_t>& count, std::vector<int64_t>& all_value, std::vector<int64_t>& all_count) const;

private:
    struct Slot {
        int64_t value;
        uint32_t group;  // cpu << 16 | kind
        int64_t count;   // 0: empty
    };
    std::vector<Slot> slots_;
    size_t used_ = 0;
    int64_t lo_ = INT64_MAX, hi_ = INT64_MIN;  // value range and largest CPU counted: entries() packs its sort keys
    uint32_t max_cpu_ = 0;
    void grow();
};

}  // namespace rtv
