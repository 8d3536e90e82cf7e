"""
Tinkerbell's objects kept by fleetd (C{[tinkerbell]}, issue 28): each
device's C{Hardware} and a C{Workflow} per run, written through the
C{[kubernetes]} client with the intent recorded first
(L{fleetd.tinkerbell.service}). A composite subsystem: it uses the
Kubernetes client (L{fleetd.kube}) and the inventory's values.
"""
