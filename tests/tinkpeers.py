"""
Test-only helpers around the grpcio tink peers, which live in
L{fleetd.testing.tinkserver} (the tink-server stand-in) and
L{fleetd.testing.tinkagent} (tink-agent and tink-worker clients).
"""

from __future__ import annotations

from typing import Any

from fleetd.tink.proto import tink_v012_pb2 as v012


def context(workflow: str, worker: str, index: int, total: int) -> bytes:
    data: bytes = v012.WorkflowContext(
        workflow_id=workflow,
        current_worker=worker,
        current_task="install",
        current_action=f"a{index}",
        current_action_index=index,
        current_action_state=v012.STATE_PENDING,
        total_number_of_actions=total,
    ).SerializeToString()
    return data


async def provisionedDevice(service: Any, mac: str) -> Any:
    """In a started daemon (L{fleetd.service}), add worker C{w1} with
    C{mac}, let the tink proxy's device index see it and provision it;
    returns the device."""
    from fleetd.inventory.model import validateDevice

    await service.loading.whenReady()
    device = validateDevice(
        name="w1",
        serial="S1",
        uuid="00000000-0000-4000-8000-000000000001",
        macs=[mac],
        device_class="worker",
    )
    await service.inventory.add(device, journal=())
    await service.tink.devices.refresh()
    await service.runs.provision(
        [device], actor="owner:test", render=lambda d, run: b"machine: {}\n"
    )
    return device
