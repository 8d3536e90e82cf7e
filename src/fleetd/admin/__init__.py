"""The admin listener: health, metrics and the owner API [A3]."""
