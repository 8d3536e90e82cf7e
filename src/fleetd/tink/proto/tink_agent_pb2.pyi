import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PreconditionFailureViolation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECONDITION_FAILURE_VIOLATION_UNSPECIFIED: _ClassVar[PreconditionFailureViolation]
    PRECONDITION_FAILURE_VIOLATION_NO_ACTION_AVAILABLE: _ClassVar[PreconditionFailureViolation]
PRECONDITION_FAILURE_VIOLATION_UNSPECIFIED: PreconditionFailureViolation
PRECONDITION_FAILURE_VIOLATION_NO_ACTION_AVAILABLE: PreconditionFailureViolation

class Processor(_message.Message):
    __slots__ = ("id", "cores", "threads", "vendor", "model", "capabilities")
    ID_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    id: int
    cores: int
    threads: int
    vendor: str
    model: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[int] = ..., cores: _Optional[int] = ..., threads: _Optional[int] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class CPU(_message.Message):
    __slots__ = ("total_cores", "total_threads", "processors")
    TOTAL_CORES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_THREADS_FIELD_NUMBER: _ClassVar[int]
    PROCESSORS_FIELD_NUMBER: _ClassVar[int]
    total_cores: int
    total_threads: int
    processors: _containers.RepeatedCompositeFieldContainer[Processor]
    def __init__(self, total_cores: _Optional[int] = ..., total_threads: _Optional[int] = ..., processors: _Optional[_Iterable[_Union[Processor, _Mapping]]] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("total", "usable")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    USABLE_FIELD_NUMBER: _ClassVar[int]
    total: str
    usable: str
    def __init__(self, total: _Optional[str] = ..., usable: _Optional[str] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("name", "controller_type", "drive_type", "size", "physical_block_size", "vendor", "model", "wwn", "serial_number")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_TYPE_FIELD_NUMBER: _ClassVar[int]
    DRIVE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WWN_FIELD_NUMBER: _ClassVar[int]
    SERIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    name: str
    controller_type: str
    drive_type: str
    size: str
    physical_block_size: str
    vendor: str
    model: str
    wwn: str
    serial_number: str
    def __init__(self, name: _Optional[str] = ..., controller_type: _Optional[str] = ..., drive_type: _Optional[str] = ..., size: _Optional[str] = ..., physical_block_size: _Optional[str] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., wwn: _Optional[str] = ..., serial_number: _Optional[str] = ...) -> None: ...

class Network(_message.Message):
    __slots__ = ("name", "mac", "speed", "enabled_capabilities")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    ENABLED_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    mac: str
    speed: str
    enabled_capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., mac: _Optional[str] = ..., speed: _Optional[str] = ..., enabled_capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class PCI(_message.Message):
    __slots__ = ("vendor", "product", "driver")
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    CLASS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    vendor: str
    product: str
    driver: str
    def __init__(self, vendor: _Optional[str] = ..., product: _Optional[str] = ..., driver: _Optional[str] = ..., **kwargs) -> None: ...

class GPU(_message.Message):
    __slots__ = ("vendor", "product", "driver")
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    CLASS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    vendor: str
    product: str
    driver: str
    def __init__(self, vendor: _Optional[str] = ..., product: _Optional[str] = ..., driver: _Optional[str] = ..., **kwargs) -> None: ...

class Chassis(_message.Message):
    __slots__ = ("serial", "vendor")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    serial: str
    vendor: str
    def __init__(self, serial: _Optional[str] = ..., vendor: _Optional[str] = ...) -> None: ...

class BIOS(_message.Message):
    __slots__ = ("vendor", "version", "release_date")
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RELEASE_DATE_FIELD_NUMBER: _ClassVar[int]
    vendor: str
    version: str
    release_date: str
    def __init__(self, vendor: _Optional[str] = ..., version: _Optional[str] = ..., release_date: _Optional[str] = ...) -> None: ...

class Baseboard(_message.Message):
    __slots__ = ("vendor", "product", "version", "serial_number")
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SERIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    vendor: str
    product: str
    version: str
    serial_number: str
    def __init__(self, vendor: _Optional[str] = ..., product: _Optional[str] = ..., version: _Optional[str] = ..., serial_number: _Optional[str] = ...) -> None: ...

class Product(_message.Message):
    __slots__ = ("name", "vendor", "serial_number")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    SERIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    name: str
    vendor: str
    serial_number: str
    def __init__(self, name: _Optional[str] = ..., vendor: _Optional[str] = ..., serial_number: _Optional[str] = ...) -> None: ...

class AgentAttributes(_message.Message):
    __slots__ = ("cpu", "memory", "block", "network", "pci", "gpu", "chassis", "bios", "baseboard", "product")
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    PCI_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    CHASSIS_FIELD_NUMBER: _ClassVar[int]
    BIOS_FIELD_NUMBER: _ClassVar[int]
    BASEBOARD_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    cpu: CPU
    memory: Memory
    block: _containers.RepeatedCompositeFieldContainer[Block]
    network: _containers.RepeatedCompositeFieldContainer[Network]
    pci: _containers.RepeatedCompositeFieldContainer[PCI]
    gpu: _containers.RepeatedCompositeFieldContainer[GPU]
    chassis: Chassis
    bios: BIOS
    baseboard: Baseboard
    product: Product
    def __init__(self, cpu: _Optional[_Union[CPU, _Mapping]] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., block: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., network: _Optional[_Iterable[_Union[Network, _Mapping]]] = ..., pci: _Optional[_Iterable[_Union[PCI, _Mapping]]] = ..., gpu: _Optional[_Iterable[_Union[GPU, _Mapping]]] = ..., chassis: _Optional[_Union[Chassis, _Mapping]] = ..., bios: _Optional[_Union[BIOS, _Mapping]] = ..., baseboard: _Optional[_Union[Baseboard, _Mapping]] = ..., product: _Optional[_Union[Product, _Mapping]] = ...) -> None: ...

class ActionRequest(_message.Message):
    __slots__ = ("agent_id", "agent_attributes")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    agent_attributes: AgentAttributes
    def __init__(self, agent_id: _Optional[str] = ..., agent_attributes: _Optional[_Union[AgentAttributes, _Mapping]] = ...) -> None: ...

class Namespaces(_message.Message):
    __slots__ = ("network", "pid")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    network: str
    pid: str
    def __init__(self, network: _Optional[str] = ..., pid: _Optional[str] = ...) -> None: ...

class ActionResponse(_message.Message):
    __slots__ = ("workflow_id", "task_id", "agent_id", "action_id", "name", "image", "timeout", "command", "volumes", "environment", "pid", "namespaces")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    task_id: str
    agent_id: str
    action_id: str
    name: str
    image: str
    timeout: int
    command: _containers.RepeatedScalarFieldContainer[str]
    volumes: _containers.RepeatedScalarFieldContainer[str]
    environment: _containers.RepeatedScalarFieldContainer[str]
    pid: str
    namespaces: Namespaces
    def __init__(self, workflow_id: _Optional[str] = ..., task_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., action_id: _Optional[str] = ..., name: _Optional[str] = ..., image: _Optional[str] = ..., timeout: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., volumes: _Optional[_Iterable[str]] = ..., environment: _Optional[_Iterable[str]] = ..., pid: _Optional[str] = ..., namespaces: _Optional[_Union[Namespaces, _Mapping]] = ...) -> None: ...

class ActionMessage(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ActionStatusRequest(_message.Message):
    __slots__ = ("workflow_id", "agent_id", "task_id", "action_id", "action_name", "action_state", "execution_start", "execution_stop", "execution_duration", "message")
    class StateType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_TYPE_UNSPECIFIED: _ClassVar[ActionStatusRequest.StateType]
        STATE_TYPE_PENDING: _ClassVar[ActionStatusRequest.StateType]
        STATE_TYPE_RUNNING: _ClassVar[ActionStatusRequest.StateType]
        STATE_TYPE_FAILED: _ClassVar[ActionStatusRequest.StateType]
        STATE_TYPE_TIMEOUT: _ClassVar[ActionStatusRequest.StateType]
        STATE_TYPE_SUCCESS: _ClassVar[ActionStatusRequest.StateType]
    STATE_TYPE_UNSPECIFIED: ActionStatusRequest.StateType
    STATE_TYPE_PENDING: ActionStatusRequest.StateType
    STATE_TYPE_RUNNING: ActionStatusRequest.StateType
    STATE_TYPE_FAILED: ActionStatusRequest.StateType
    STATE_TYPE_TIMEOUT: ActionStatusRequest.StateType
    STATE_TYPE_SUCCESS: ActionStatusRequest.StateType
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_STATE_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_START_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_STOP_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_DURATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    agent_id: str
    task_id: str
    action_id: str
    action_name: str
    action_state: ActionStatusRequest.StateType
    execution_start: _timestamp_pb2.Timestamp
    execution_stop: _timestamp_pb2.Timestamp
    execution_duration: str
    message: ActionMessage
    def __init__(self, workflow_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., task_id: _Optional[str] = ..., action_id: _Optional[str] = ..., action_name: _Optional[str] = ..., action_state: _Optional[_Union[ActionStatusRequest.StateType, str]] = ..., execution_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., execution_stop: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., execution_duration: _Optional[str] = ..., message: _Optional[_Union[ActionMessage, _Mapping]] = ...) -> None: ...

class ActionStatusResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
