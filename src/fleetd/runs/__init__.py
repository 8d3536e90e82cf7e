"""Provision runs: rendered configurations, one-time codes, delivery [C1]."""
