"""
Tinkerbell's objects kept by fleetd (C{[tinkerbell]}, issue 28): each
device's C{Hardware} and a C{Workflow} per run, written through the
C{[kubernetes]} client with the intent recorded first
(L{fleetd.tinkerbell.service}). A subsystem beside L{fleetd.kube}: it
uses the Kubernetes client (L{fleetd.k8s}) and the inventory's values.
"""
