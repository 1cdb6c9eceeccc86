"""vtalloc.server.protocol: what the daemon and its clients both speak, beside the gRPC stubs.

Owns the shared half of the service, so that the client library never imports the daemon:
- address.py: where the daemon listens (default socket path, ``unix://`` addresses, the
  side channel's path beside the gRPC socket);
- side_channel.py: the side channel's framing (one JSON datagram per message, descriptors
  by SCM_RIGHTS), its protocol version and limits, and the blocking socket calls;
- rpc.py: what every gRPC call carries (the session key), the service names, the limits
  of one request, and the node counters as the proto declares them;
- errors.py: the service's typed errors and the one table between them and gRPC status
  codes, both ways.
Layer: above vtalloc.allocator, beside vtalloc.server.proto; imported by the daemon
(vtalloc.server) and by the client library (vtalloc.client), never the other way.
"""
