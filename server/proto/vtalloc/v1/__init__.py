"""Generated stubs of protobuf package ``vtalloc.v1`` (pages.proto, admin.proto); see ../../generate.py."""
