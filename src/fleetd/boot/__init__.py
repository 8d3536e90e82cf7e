"""The boot listener: device flow and configuration delivery only [A2]."""
