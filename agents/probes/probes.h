/* The probe registry: one file per probe, one word per probe here. */
#ifndef RTV_PROBES_H
#define RTV_PROBES_H
#include "rtv.h"

#define RTV_PROBE_LIST(X) X(timer) X(gap) X(kops) X(workload) X(threadmetric) X(wakeup) X(selftest)

#define RTV_DECLARE_PROBE(name) extern const rtv_probe rtv_probe_##name;
RTV_PROBE_LIST(RTV_DECLARE_PROBE)
#undef RTV_DECLARE_PROBE

#endif
