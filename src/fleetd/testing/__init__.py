"""
Reusable, strict in-process fakes of fleetd's external peers, for tests
and the simulator. Each says in its docstring which documented behaviours
it models, and is pinned by a contract test.
"""
