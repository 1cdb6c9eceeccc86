"""gRPC server reflection under both names clients ask for: grpc.reflection.v1 and v1alpha.

Owns: ``enable_reflection(service_names, server)``, which serves one reflection servicer
(grpcio-reflection's, which ships only v1alpha) under ``grpc.reflection.v1alpha.ServerReflection``
and ``grpc.reflection.v1.ServerReflection``, and describes the v1 service in the descriptor pool.
Invariants: v1 is v1alpha renamed (the same messages, field numbers and method), so v1alpha's
serializers are v1's; grpcurl and newer clients try v1 first, older ones v1alpha, and both list
the same services. When grpcio-reflection grows its own v1, use it instead of this alias.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

__all__ = ["V1_SERVICE", "V1ALPHA_SERVICE", "enable_reflection", "v1_descriptor"]

log = logging.getLogger(__name__)

V1ALPHA_SERVICE: str = reflection.SERVICE_NAME
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def v1_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """v1alpha's reflection.proto with its package (and every type it names) renamed to v1."""
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old, new = "." + fdp.package + ".", ".grpc.reflection.v1."
    fdp.name, fdp.package = _V1_FILE, "grpc.reflection.v1"
    for message in fdp.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old):]
    for service in fdp.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old):]
            method.output_type = new + method.output_type[len(old):]
    return fdp


def _describe_v1(pool: Any) -> None:
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    try:
        pool.AddSerializedFile(v1_descriptor().SerializeToString())
    except Exception as e:  # noqa: BLE001 - describing v1 is a nicety; serving it does not need it
        log.warning("grpc.reflection.v1 is served but not described: %s", e)


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection for ``service_names`` (the reflection services are added) on ``server``."""
    _describe_v1(descriptor_pool.Default())
    names = (*service_names, V1_SERVICE, V1ALPHA_SERVICE)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(V1_SERVICE, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString),
    })
    server.add_generic_rpc_handlers((v1,))
