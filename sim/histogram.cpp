// See histogram.h.
#include "histogram.h"

#include <algorithm>
#include <utility>

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
                lo_ = std::min(lo_, values[r]);
                hi_ = std::max(hi_, values[r]);
                max_cpu_ = std::max(max_cpu_, group >> 16);
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

// LSD radix sort of (key, payload) pairs on the low `bits` bits of the key, a byte a pass (256 buckets stay in
// cache; wider digits thrash it); the digits' counts are taken in one read, and a byte that is the same in every
// key (the high bytes of a narrow value range, of few kinds) costs no pass. Several times faster than std::sort
// with a three-field comparison on the 1.75 M distinct values of the 8-VM hour.
using Keyed = std::pair<uint64_t, int64_t>;
static void radix_sort(std::vector<Keyed>& a, int bits) {
    const int passes = (bits + 7) / 8;
    std::vector<size_t> counts(static_cast<size_t>(passes) * 256, 0);
    for (const Keyed& x : a) {
        for (int d = 0; d < passes; ++d) ++counts[static_cast<size_t>(d) * 256 + ((x.first >> (8 * d)) & 0xFF)];
    }
    std::vector<Keyed> buffer(a.size());
    for (int d = 0; d < passes; ++d) {
        size_t* offsets = &counts[static_cast<size_t>(d) * 256];
        if (std::find(offsets, offsets + 256, a.size()) != offsets + 256) continue;  // one value of this byte
        size_t sum = 0;
        for (int i = 0; i < 256; ++i) {
            const size_t c = offsets[i];
            offsets[i] = sum;
            sum += c;
        }
        for (const Keyed& x : a) buffer[offsets[(x.first >> (8 * d)) & 0xFF]++] = x;
        a.swap(buffer);
    }
}

void GroupHistograms::entries(std::vector<int16_t>& cpu, std::vector<int16_t>& kind, std::vector<int64_t>& value,
                              std::vector<int64_t>& count, std::vector<int64_t>& all_value,
                              std::vector<int64_t>& all_count) const {
    const int64_t lo = lo_;
    cpu.reserve(used_);
    kind.reserve(used_);
    value.reserve(used_);
    count.reserve(used_);
    // kind, value, cpu: each kind's values ascending, the CPUs of one value side by side
    if (used_ > 0 && static_cast<uint64_t>(hi_) - static_cast<uint64_t>(lo) < (uint64_t{1} << 40) && max_cpu_ < 256) {
        // kind (16 bits) | value - lo (40) | cpu (8): one integer key in that order
        std::vector<Keyed> keyed;
        keyed.reserve(used_);
        for (const Slot& s : slots_) {
            if (s.count == 0) continue;
            keyed.emplace_back(uint64_t{s.group & 0xFFFF} << 48 | (static_cast<uint64_t>(s.value - lo) << 8) |
                                   (s.group >> 16),
                               s.count);
        }
        radix_sort(keyed, 64);
        for (const Keyed& k : keyed) {
            cpu.push_back(static_cast<int16_t>(k.first & 0xFF));
            kind.push_back(static_cast<int16_t>(k.first >> 48));
            value.push_back(lo + static_cast<int64_t>((k.first >> 8) & ((uint64_t{1} << 40) - 1)));
            count.push_back(k.second);
        }
        for (Keyed& k : keyed) k.first = (k.first >> 8) & ((uint64_t{1} << 40) - 1);  // value - lo alone
        radix_sort(keyed, 40);
        for (const Keyed& k : keyed) {
            const int64_t v = lo + static_cast<int64_t>(k.first);
            if (!all_value.empty() && all_value.back() == v) {
                all_count.back() += k.second;
            } else {
                all_value.push_back(v);
                all_count.push_back(k.second);
            }
        }
        return;
    }
    std::vector<Slot> found;
    found.reserve(used_);
    for (const Slot& s : slots_) {
        if (s.count != 0) found.push_back(s);
    }
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
    std::sort(found.begin(), found.end(), [](const Slot& a, const Slot& b) { return a.value < b.value; });
    for (const Slot& s : found) {
        if (!all_value.empty() && all_value.back() == s.value) {
            all_count.back() += s.count;
        } else {
            all_value.push_back(s.value);
            all_count.push_back(s.count);
        }
    }
}

}  // namespace rtv
