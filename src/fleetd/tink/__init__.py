"""
The tink listener's Tinkerbell semantics ([A4], [B1]-[B3]): what the
agent's calls say about a workflow (L{fleetd.tink.observe},
L{fleetd.tink.workflows}, L{fleetd.tink.wfstate}), boot completion
(L{fleetd.tink.boot}, L{fleetd.tink.completion}) and the proxy assembled
from its settings (L{fleetd.tink.service}). The HTTP/2 and gRPC mechanics
beneath them are L{fleetd.h2}.
"""
