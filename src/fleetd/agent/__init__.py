"""fleetd-agent: the node-side client, run as a Tinkerbell action in HookOS."""
