"""
C{fleetd-sim}: a rack of virtual nodes enrolled end to end against fleetd
(docs/design.md, the rack simulator's faults), its own swtpm per node,
with the project's stand-ins (L{fleetd.testing}) for the peers fleetd
talks to.
"""
