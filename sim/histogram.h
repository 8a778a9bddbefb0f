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

    // What entries() returns: every (cpu, kind, value, count) sorted by kind, value, cpu (histogram.parquet's
    // rows) with each row's kind as an index into `kinds` (the kinds present, ascending); per kind, its values
    // ascending with their counts summed over the CPUs (kind_value/kind_count, kind i's at
    // kind_offsets[i]..kind_offsets[i + 1]); and the pooled histogram of every group (all_value/all_count).
    struct Entries {
        std::vector<int16_t> cpu, kind_index, kinds;
        std::vector<int64_t> value, count, kind_value, kind_count, kind_offsets, all_value, all_count;
    };
    Entries entries() const;

private:
    struct Slot {
        int64_t value;
        uint32_t group;  // cpu << 16 | kind
        int64_t count;   // 0: empty
    };
    std::vector<Slot> slots_;
    size_t used_ = 0;
    int64_t lo_ = INT64_MAX, hi_ = INT64_MIN;  // value range, largest CPU and kind counted: entries() packs its
    uint32_t max_cpu_ = 0, max_kind_ = 0;      // sort keys and sizes its kind pass
    void grow();
};

}  // namespace rtv
