"""
NetBox as fleetd's inventory: the REST client (L{client}), the device
mapping (L{devices}), the durable outbox (L{outbox}) and its worker
(L{push}, L{worker}), the journal mirror (L{mirror}), the service that
runs them (L{service}), and the inventory itself: L{inventory.NetBoxInventory},
fleetd's L{IInventory} over NetBox, with its cached device list (L{cache}).
"""
