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
                max_kind_ = std::max(max_kind_, group & 0xFFFF);
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

// LSD radix sort of (key, payload) pairs on the low `bits` bits of the key, in as few passes of at most 11 bits
// as the key needs, with digits as even as possible (a 26-bit key: 3 passes of 9 bits rather than 4 of 8; up to
// 2,048 buckets stay in cache); the digits' counts are taken in one read, and a digit that is the same in every
// key (the high bits of a narrow value range) costs no pass. Several times faster than std::sort with a
// three-field comparison on the 1.75 M distinct values of the 8-VM hour.
using Keyed = std::pair<uint64_t, uint64_t>;
// `buffer` is scratch of a's size (the caller may reuse it afterwards: fresh pages cost their faults and zeroing)
static void radix_sort(std::vector<Keyed>& a, std::vector<Keyed>& buffer, int bits) {
    const int passes = std::max(1, (bits + 10) / 11);
    const int width = (bits + passes - 1) / passes;
    const size_t buckets = size_t{1} << width;
    const uint64_t mask = buckets - 1;
    std::vector<size_t> counts(static_cast<size_t>(passes) * buckets, 0);
    for (const Keyed& x : a) {
        for (int d = 0; d < passes; ++d) ++counts[static_cast<size_t>(d) * buckets + ((x.first >> (width * d)) & mask)];
    }
    for (int d = 0; d < passes; ++d) {
        size_t* offsets = &counts[static_cast<size_t>(d) * buckets];
        if (std::find(offsets, offsets + buckets, a.size()) != offsets + buckets) continue;  // one value of this digit
        size_t sum = 0;
        for (size_t i = 0; i < buckets; ++i) {
            const size_t c = offsets[i];
            offsets[i] = sum;
            sum += c;
        }
        for (const Keyed& x : a) buffer[offsets[(x.first >> (width * d)) & mask]++] = x;
        a.swap(buffer);
    }
}

static int bits_for(uint64_t largest) {  // bits of the largest key (at least 1)
    int bits = 1;
    while (bits < 64 && (largest >> bits) != 0) ++bits;
    return bits;
}

namespace {
// Appends rows that arrive sorted by kind, value, cpu, and the per-kind totals over the CPUs on the way.
struct EntriesBuilder {
    GroupHistograms::Entries& out;
    void row(int16_t cpu, int16_t kind, int64_t value, int64_t count) {
        if (out.kinds.empty() || out.kinds.back() != kind) {
            out.kinds.push_back(kind);
            out.kind_offsets.push_back(static_cast<int64_t>(out.kind_value.size()));
        } else if (out.kind_value.back() == value) {  // the same value on another CPU
            out.kind_count.back() += count;
            push(cpu, value, count);
            return;
        }
        out.kind_value.push_back(value);
        out.kind_count.push_back(count);
        push(cpu, value, count);
    }
    void push(int16_t cpu, int64_t value, int64_t count) {
        out.cpu.push_back(cpu);
        out.kind_index.push_back(static_cast<int16_t>(out.kinds.size() - 1));
        out.value.push_back(value);
        out.count.push_back(count);
    }
    void pooled(int64_t value, int64_t count) {  // values arrive ascending
        if (!out.all_value.empty() && out.all_value.back() == value) {
            out.all_count.back() += count;
        } else {
            out.all_value.push_back(value);
            out.all_count.push_back(count);
        }
    }
};
}  // namespace

GroupHistograms::Entries GroupHistograms::entries() const {
    Entries out;
    EntriesBuilder build{out};
    // every column holds at most one row per entry: reserved once (untouched pages cost nothing), no regrowth
    for (auto* column : {&out.value, &out.count, &out.kind_value, &out.kind_count, &out.all_value, &out.all_count})
        column->reserve(used_);
    for (auto* column : {&out.cpu, &out.kind_index}) column->reserve(used_);
    const int64_t lo = lo_;
    if (used_ > 0 && static_cast<uint64_t>(hi_) - static_cast<uint64_t>(lo) < (uint64_t{1} << 40) && max_cpu_ < 256) {
        // One radix sort, value-major: key (value - lo) << cpu_bits | cpu, payload count << 16 | kind. Equal
        // values are then adjacent (the pooled histogram), and one stable pass by kind gives kind, value, cpu.
        const int cpu_bits = bits_for(max_cpu_);
        const uint64_t cpu_mask = (uint64_t{1} << cpu_bits) - 1;
        std::vector<Keyed> keyed;
        keyed.reserve(used_);
        for (const Slot& s : slots_) {
            if (s.count == 0) continue;
            keyed.emplace_back(static_cast<uint64_t>(s.value - lo) << cpu_bits | (s.group >> 16),
                               static_cast<uint64_t>(s.count) << 16 | (s.group & 0xFFFF));
        }
        std::vector<Keyed> by_kind(keyed.size());  // the sort's scratch, then the rows in kind order
        radix_sort(keyed, by_kind, bits_for(static_cast<uint64_t>(hi_ - lo) << cpu_bits | cpu_mask));
        for (const Keyed& k : keyed) {
            build.pooled(lo + static_cast<int64_t>(k.first >> cpu_bits), static_cast<int64_t>(k.second >> 16));
        }
        std::vector<size_t> at(size_t{max_kind_} + 2, 0);
        for (const Keyed& k : keyed) ++at[(k.second & 0xFFFF) + 1];
        for (size_t i = 1; i < at.size(); ++i) at[i] += at[i - 1];
        for (const Keyed& k : keyed) by_kind[at[k.second & 0xFFFF]++] = k;
        for (const Keyed& k : by_kind) {
            build.row(static_cast<int16_t>(k.first & cpu_mask), static_cast<int16_t>(k.second & 0xFFFF),
                      lo + static_cast<int64_t>(k.first >> cpu_bits), static_cast<int64_t>(k.second >> 16));
        }
    } else {
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
            build.row(static_cast<int16_t>(s.group >> 16), static_cast<int16_t>(s.group & 0xFFFF), s.value, s.count);
        }
        std::sort(found.begin(), found.end(), [](const Slot& a, const Slot& b) { return a.value < b.value; });
        for (const Slot& s : found) build.pooled(s.value, s.count);
    }
    out.kind_offsets.push_back(static_cast<int64_t>(out.kind_value.size()));
    return out;
}

}  // namespace rtv
