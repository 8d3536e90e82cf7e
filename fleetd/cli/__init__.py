"""Command-line clients: fleetctl (owner) and fleetd-agent (node)."""
