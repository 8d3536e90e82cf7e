"""
The inventory of record: devices, their status, released served-config
records.  L{IInventory} is the interface; L{SQLiteInventory} is the
embedded default (a NetBox backend implements the same interface).
"""

from fleetd.inventory.csvimport import parseDeviceCSV
from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    IInventory,
    InventoryError,
    ServedRecord,
    validateDevice,
)
from fleetd.inventory.sqlite import SQLiteInventory

__all__ = [
    "Device",
    "DeviceStatus",
    "IInventory",
    "InventoryError",
    "SQLiteInventory",
    "ServedRecord",
    "parseDeviceCSV",
    "validateDevice",
]
