// The one table of hypervisor schedulers.
#include "../core.h"
#include "schedulers.h"

namespace rtv {

const std::vector<HvEntry>& hv_registry() {
    static const std::vector<HvEntry> table = {
        {"partitioned", make_partitioned},
        {"fifo", make_fifo},
        {"rtds", make_rtds},
        {"sedf", make_sedf},
        {"sedf-prime", make_sedf_prime},
        {"psedf", make_psedf},
        {"credit", make_credit},
        {"arinc653", make_arinc653},
        {"deadline", make_deadline},
        {"fair", make_fair},
    };
    return table;
}

}  // namespace rtv
