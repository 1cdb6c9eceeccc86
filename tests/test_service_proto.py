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


def _mismatches(view_type, descriptor, path: str) -> list[str]:
    """Fields of a ledger view (and of the views inside it) that its proto message lacks or types differently."""
    import dataclasses
    import typing

    out = []
    hints = typing.get_type_hints(view_type)
    for f in dataclasses.fields(view_type):
        field = descriptor.fields_by_name.get(f.name)
        where = f"{path}.{f.name}"
        if field is None:
            out.append(f"{where}: no such field in {descriptor.full_name}")
            continue
        hint = hints[f.name]
        repeated = typing.get_origin(hint) is tuple
        inner = typing.get_args(hint)[0] if repeated else hint
        if repeated != field.is_repeated:
            out.append(f"{where}: repeated in one, not in the other")
        if dataclasses.is_dataclass(inner):
            if field.message_type is None:
                out.append(f"{where}: a view, but {field.full_name} is not a message")
            else:
                out += _mismatches(inner, field.message_type, where)
    return out


def test_ledger_views_mirror_the_proto_messages_field_by_field():
    """service.to_message fills a message from a view by field name: a renamed field must fail here, not at run time."""
    from vtalloc.server.quota import Quota
    from vtalloc.server.views import ClientReport, NodeView, PageMapView, SessionInfoView

    pairs = [(NodeView, pages_pb2.NodeStats), (PageMapView, pages_pb2.PageMap),
             (SessionInfoView, pages_pb2.SessionInfo), (Quota, pages_pb2.Quota),
             (ClientReport, pages_pb2.ClientReport)]
    problems = [m for view, msg in pairs for m in _mismatches(view, msg.DESCRIPTOR, view.__name__)]
    assert problems == []
    # The check sees a drift: a view with one field the message lacks.
    import dataclasses
    Drifted = dataclasses.make_dataclass("Drifted", [("capacity_pages", int), ("no_such_field", int)], frozen=True)
    assert _mismatches(Drifted, pages_pb2.DeviceStats.DESCRIPTOR, "Drifted") != []
