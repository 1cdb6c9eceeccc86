"""The committed gRPC stubs: importable from the package, and exactly what the pinned generator makes."""

from __future__ import annotations

from pathlib import Path

from vtalloc.server.proto import generate
from vtalloc.server.proto.vtalloc.v1 import admin_pb2, admin_pb2_grpc, pages_pb2, pages_pb2_grpc


def test_stubs_import_from_the_package_path_and_name_the_v1_services():
    assert pages_pb2.DESCRIPTOR.package == "vtalloc.v1" and admin_pb2.DESCRIPTOR.package == "vtalloc.v1"
    assert set(pages_pb2.DESCRIPTOR.services_by_name) == {"Pages"}
    assert set(admin_pb2.DESCRIPTOR.services_by_name) == {"Admin"}
    assert hasattr(pages_pb2_grpc, "PagesStub") and hasattr(admin_pb2_grpc, "AdminStub")
    assert "from vtalloc.v1 import" not in Path(admin_pb2_grpc.__file__).read_text()


def test_regenerating_the_stubs_changes_nothing():
    """CI fails here when a .proto changed without `python server/proto/generate.py`."""
    assert generate.stale_files() == []
