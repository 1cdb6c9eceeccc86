"""Generated code namespace for the ``vtalloc.*`` protobuf packages (see ../generate.py)."""
