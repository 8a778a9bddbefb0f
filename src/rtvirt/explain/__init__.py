"""Explain outliers layer by layer: what ran instead of the measuring thread on the host, in the hypervisor
and in the guest, joined with the run's samples on one clock (docs/explain.md)."""
