"""fleetctl: the owner's command-line client for the admin API."""
