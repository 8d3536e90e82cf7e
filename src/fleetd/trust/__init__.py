"""
Machine trust: evidence tying chassis serials to EK digests, the owner's
approved EK bindings [T1], and the disks nodes report [D1].
"""
