// See histogram.h.
#include "histogram.h"

#include <algorithm>

namespace rtv {

static inline size_t slot_of(int64_t value, uint32_t group, size_t mask) {
    uint64_t h = static_cast<uint64_t>(value) * 0x9E3779B97F4A7C15ULL ^ (uint64_t{group} * 0xC2B2AE3D27D4EB4FULL);
    return static_cast<size_t>(h ^ (h >> 29)) & mask;
}

void GroupHistograms::grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.count == 0) continue;
        size_t i = slot_of(s.value, s.group, mask);
        while (slots_[i].count != 0) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

void GroupHistograms::add(const int64_t* values, const int16_t* cpu, const int16_t* kind, size_t n) {
    for (size_t r = 0; r < n; ++r) {
        if (2 * (used_ + 1) > slots_.size()) grow();  // at most half full: short probe runs
        const uint32_t group = static_cast<uint32_t>(static_cast<uint16_t>(cpu[r])) << 16 |
                               static_cast<uint16_t>(kind[r]);
        const size_t mask = slots_.size() - 1;
        size_t i = slot_of(values[r], group, mask);
        for (;;) {
            Slot& s = slots_[i];
            if (s.count == 0) {
                s = Slot{values[r], group, 1};
                ++used_;
                break;
            }
            if (s.value == values[r] && s.group == group) {
                ++s.count;
                break;
            }
            i = (i + 1) & mask;
        }
    }
}

void GroupHistograms::entries(std::vector<int16_t>& cpu, std::vector<int16_t>& kind, std::vector<int64_t>& value,
                              std::vector<int64_t>& count) const {
    std::vector<Slot> found;
    found.reserve(used_);
    for (const Slot& s : slots_) {
        if (s.count != 0) found.push_back(s);
    }
    // kind, value, cpu: each kind's values ascending, the CPUs of one value side by side
    std::sort(found.begin(), found.end(), [](const Slot& a, const Slot& b) {
        uint32_t ka = a.group & 0xFFFF, kb = b.group & 0xFFFF;
        if (ka != kb) return ka < kb;
        return a.value != b.value ? a.value < b.value : a.group < b.group;
    });
    for (const Slot& s : found) {
        cpu.push_back(static_cast<int16_t>(s.group >> 16));
        kind.push_back(static_cast<int16_t>(s.group & 0xFFFF));
        value.push_back(s.value);
        count.push_back(s.count);
    }
}

}  // namespace rtv
