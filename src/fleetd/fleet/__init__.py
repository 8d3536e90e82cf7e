"""
The owner's fleet operations, free of HTTP, for the admin API, the
console and the rack simulator alike: a provision (L{fleetd.fleet.provision}),
a retirement (L{fleetd.fleet.retire}), one device's state
(L{fleetd.fleet.status}) and the fleet at a glance (L{fleetd.fleet.view}).
"""
