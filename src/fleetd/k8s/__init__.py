"""
A small Kubernetes API client, beneath every subsystem that talks to the
cluster (L{fleetd.kube}'s credentials, L{fleetd.tinkerbell}'s objects,
L{fleetd.tink.wfstate}'s Workflow watch): the calls (L{fleetd.k8s.client}),
their errors (L{fleetd.k8s.errors}), response bodies and watch streams
(L{fleetd.k8s.stream}), the client built from C{[kubernetes]}
(L{fleetd.k8s.connect}) and the list-then-watch loop (L{fleetd.k8s.watcher}).
It knows no subsystem.
"""
