"""
NetBox as fleetd's inventory: the REST client (L{client}), the device
mapping (L{devices}), the durable outbox (L{outbox}) and its worker
(L{push}, L{worker}), the journal mirror (L{mirror}), and the service that
runs them (L{service}). The inventory itself is
L{fleetd.inventory.netbox.NetBoxInventory}.
"""
