import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_PENDING: _ClassVar[State]
    STATE_RUNNING: _ClassVar[State]
    STATE_FAILED: _ClassVar[State]
    STATE_TIMEOUT: _ClassVar[State]
    STATE_SUCCESS: _ClassVar[State]
STATE_PENDING: State
STATE_RUNNING: State
STATE_FAILED: State
STATE_TIMEOUT: State
STATE_SUCCESS: State

class WorkflowContextRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class WorkflowContext(_message.Message):
    __slots__ = ("workflow_id", "current_worker", "current_task", "current_action", "current_action_index", "current_action_state", "total_number_of_actions")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_WORKER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TASK_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ACTION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ACTION_INDEX_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ACTION_STATE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NUMBER_OF_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    current_worker: str
    current_task: str
    current_action: str
    current_action_index: int
    current_action_state: State
    total_number_of_actions: int
    def __init__(self, workflow_id: _Optional[str] = ..., current_worker: _Optional[str] = ..., current_task: _Optional[str] = ..., current_action: _Optional[str] = ..., current_action_index: _Optional[int] = ..., current_action_state: _Optional[_Union[State, str]] = ..., total_number_of_actions: _Optional[int] = ...) -> None: ...

class WorkflowActionsRequest(_message.Message):
    __slots__ = ("workflow_id",)
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    def __init__(self, workflow_id: _Optional[str] = ...) -> None: ...

class WorkflowAction(_message.Message):
    __slots__ = ("task_name", "name", "image", "timeout", "command", "on_timeout", "on_failure", "worker_id", "volumes", "environment", "pid")
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ON_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ON_FAILURE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    task_name: str
    name: str
    image: str
    timeout: int
    command: _containers.RepeatedScalarFieldContainer[str]
    on_timeout: _containers.RepeatedScalarFieldContainer[str]
    on_failure: _containers.RepeatedScalarFieldContainer[str]
    worker_id: str
    volumes: _containers.RepeatedScalarFieldContainer[str]
    environment: _containers.RepeatedScalarFieldContainer[str]
    pid: str
    def __init__(self, task_name: _Optional[str] = ..., name: _Optional[str] = ..., image: _Optional[str] = ..., timeout: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., on_timeout: _Optional[_Iterable[str]] = ..., on_failure: _Optional[_Iterable[str]] = ..., worker_id: _Optional[str] = ..., volumes: _Optional[_Iterable[str]] = ..., environment: _Optional[_Iterable[str]] = ..., pid: _Optional[str] = ...) -> None: ...

class WorkflowActionList(_message.Message):
    __slots__ = ("action_list",)
    ACTION_LIST_FIELD_NUMBER: _ClassVar[int]
    action_list: _containers.RepeatedCompositeFieldContainer[WorkflowAction]
    def __init__(self, action_list: _Optional[_Iterable[_Union[WorkflowAction, _Mapping]]] = ...) -> None: ...

class WorkflowActionStatus(_message.Message):
    __slots__ = ("workflow_id", "task_name", "action_name", "action_status", "seconds", "message", "created_at", "worker_id")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_STATUS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    task_name: str
    action_name: str
    action_status: State
    seconds: int
    message: str
    created_at: _timestamp_pb2.Timestamp
    worker_id: str
    def __init__(self, workflow_id: _Optional[str] = ..., task_name: _Optional[str] = ..., action_name: _Optional[str] = ..., action_status: _Optional[_Union[State, str]] = ..., seconds: _Optional[int] = ..., message: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., worker_id: _Optional[str] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
