"""
fleetd's side of the cluster being joined (design.md, rules, Kubernetes
credentials): per-node bootstrap tokens [K1], the kubelet CSR approver
[K2], token deletion after approval [K4], the auto-approve check [K3],
cluster-wide tokens [K5][K6] and retirement [R1].
"""
