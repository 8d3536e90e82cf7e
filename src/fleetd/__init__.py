"""fleetd: enroll and provision bare-metal Talos Linux nodes for one site."""

__version__ = "0.1.0"
