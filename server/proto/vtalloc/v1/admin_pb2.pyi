from vtalloc.server.proto.vtalloc.v1 import pages_pb2 as _pages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetQuotaRequest(_message.Message):
    __slots__ = ("principal",)
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    principal: str
    def __init__(self, principal: _Optional[str] = ...) -> None: ...

class QuotaList(_message.Message):
    __slots__ = ("quotas", "default_quota")
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_QUOTA_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[_pages_pb2.Quota]
    default_quota: _pages_pb2.Quota
    def __init__(self, quotas: _Optional[_Iterable[_Union[_pages_pb2.Quota, _Mapping]]] = ..., default_quota: _Optional[_Union[_pages_pb2.Quota, _Mapping]] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("principal", "min_bytes", "max_bytes")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    principal: str
    min_bytes: int
    max_bytes: int
    def __init__(self, principal: _Optional[str] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class EvictSessionRequest(_message.Message):
    __slots__ = ("session_id", "pages", "kill_on_miss")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    KILL_ON_MISS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    pages: int
    kill_on_miss: bool
    def __init__(self, session_id: _Optional[str] = ..., pages: _Optional[int] = ..., kill_on_miss: _Optional[bool] = ...) -> None: ...

class EvictSessionReply(_message.Message):
    __slots__ = ("asked", "returned", "missed", "killed")
    ASKED_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    KILLED_FIELD_NUMBER: _ClassVar[int]
    asked: int
    returned: int
    missed: bool
    killed: bool
    def __init__(self, asked: _Optional[int] = ..., returned: _Optional[int] = ..., missed: _Optional[bool] = ..., killed: _Optional[bool] = ...) -> None: ...
