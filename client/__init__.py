"""vtalloc.client: the command line (``vtalloc``) and the client library of the service."""
