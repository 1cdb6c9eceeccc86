"""A client process for the service tests, driven by one JSON command per line on stdin.

Each command gets one JSON answer on stdout: ``{"ok": true, ...}`` or ``{"ok": false,
"error": "<exception class>", "message": ...}``. It uses the real client library
(ServiceAddressSpace(...)), plus a raw session for protocol-level steps a well-behaved
client never takes (leasing without reading the descriptors, calling RPCs by hand).

Commands: open, malloc, pause, resume, check, free, lease, give_back, trim, stats, session_id, fork_try_lease, spawn_socket_holder, churn, set_evictable, residency, restore_loop, close,
raw_open, raw_lease, rpc, exit (see ``handle``). With ``--drop-to UID:GID`` it first becomes
that user (it must start as root).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback


def pattern(seed: int, n: int) -> bytes:
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest()
    return (block * (n // len(block) + 1))[:n]


class Client:
    def __init__(self) -> None:
        self.space = None
        self.raw = None

    def evict_handler(self, mode: str, sleep_s: float, marker: str | None):
        from vtalloc.client.service_space import default_evict_handler

        def handler(space, pages, give_back):
            if marker:
                with open(marker, "a") as f:
                    f.write(f"{pages}\n")
            if mode == "stuck":
                time.sleep(3600)
            if mode == "slow":
                time.sleep(sleep_s)
            if mode == "refuse":
                return 0
            return default_evict_handler(space, pages, give_back)

        return handler

    def handle(self, op: str, a: dict) -> dict:
        from vtalloc.client import ServiceAddressSpace

        if op == "open":
            self.space = ServiceAddressSpace(
                a["address"], lease_batch_pages=a.get("batch", 2), keep_free_pages=a.get("keep_free"),
                report_interval_s=a.get("report_interval", 0.1), rpc_timeout_s=a.get("timeout", 5.0),
                evict_handler=self.evict_handler(a.get("evict", "default"), a.get("sleep", 0.0), a.get("marker")))
            return {"session_id": self.space.session.session_id, "page_bytes": self.space.page_bytes}
        if op == "malloc":  # "tag": the allocation is made in that region (docs/regions.md)
            if a.get("tag"):
                with self.space.region(a["tag"]):
                    addr = self.space.malloc(a["nbytes"])
            else:
                addr = self.space.malloc(a["nbytes"])
            self.space.write(addr, pattern(a.get("seed", 0), a["nbytes"]))
            return {"addr": addr}
        if op == "pause":
            return {"bytes": self.space.pause(a["tag"], discard=a.get("discard", False))}
        if op == "resume":
            return {"bytes": self.space.resume(a["tag"], timeout=a.get("timeout", 0.0))}
        if op == "check":
            data = self.space.read(a["addr"], a["nbytes"])
            return {"intact": data == pattern(a.get("seed", 0), a["nbytes"])}
        if op == "free":
            self.space.free(a["addr"])
            return {}
        if op == "lease":
            return {"leased": self.space.lease(a["pages"])}
        if op == "give_back":
            return {"returned": self.space.give_back(a["pages"])}
        if op == "trim":
            return {"bytes": self.space.trim()}
        if op == "stats":
            return {"stats": self.space.stats().as_dict()}
        if op == "session_id":
            return {"session_id": self.space.session.session_id}
        if op == "fork_try_lease":  # the child must not act as the parent's session
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    self.space.lease(1)
                    name = "no error"
                except BaseException as e:  # noqa: BLE001
                    name = type(e).__name__
                os.write(w, name.encode())
                os._exit(0)
            os.close(w)
            with os.fdopen(r) as f:
                name = f.read()
            os.waitpid(pid, 0)
            return {"child_error": name}
        if op == "churn":  # many lease/return round trips, each checked for data integrity
            import random

            rng = random.Random(a["seed"])
            leased = returned = bad = 0
            page = self.space.page_bytes
            for i in range(a["rounds"]):
                k = rng.randint(1, 3)
                leased += self.space.lease(k)
                n = k * page - rng.randint(0, 4096)
                addr = self.space.malloc(n)
                self.space.write(addr, pattern(a["seed"] * 100_000 + i, n))
                bad += self.space.read(addr, n) != pattern(a["seed"] * 100_000 + i, n)
                self.space.free(addr)
                returned += self.space.give_back(self.space.stats().pages_total)
            return {"leased": leased, "returned": returned, "corrupt": bad, "held": self.space.stats().pages_total}
        if op == "set_evictable":
            self.space.set_evictable(a["addr"], a.get("flag", True))
            return {}
        if op == "residency":
            return {"residency": self.space.residency(a["addr"])}
        if op == "restore_loop":  # restore evicted allocations again and again, until killed or done
            if a.get("marker"):
                open(a["marker"], "w").close()
            end = time.monotonic() + a["seconds"]
            rounds = 0
            while time.monotonic() < end:
                for addr in a["addrs"]:
                    self.space.ensure_resident(addr)
                    self.space.offload(addr)
                rounds += 1
            return {"rounds": rounds}
        if op == "spawn_socket_holder":  # another process holding our side channel open
            import subprocess

            holder = subprocess.Popen(["sleep", "60"], pass_fds=[self.space.session._sock.fileno()])
            return {"pid": holder.pid}
        if op == "close":
            self.space.close()
            return {}
        if op == "raw_open":
            from vtalloc.client.session import ServiceSession

            self.raw = ServiceSession(a["address"], kind=a.get("kind", "client"), timeout_s=a.get("timeout", 5.0))
            return {"session_id": self.raw.session_id, "uid": self.raw.hello.uid}
        if op == "raw_lease":  # lease and never read the descriptors
            from vtalloc.server.proto.vtalloc.v1 import pages_pb2

            r = self.raw.call(self.raw.pages, "Lease", pages_pb2.LeaseRequest(pages=a["pages"]))
            return {"page_ids": list(r.page_ids)}
        if op == "rpc":
            from google.protobuf import json_format

            from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2

            stub = self.raw.admin if a["service"] == "admin" else self.raw.pages
            module = admin_pb2 if a["service"] == "admin" else pages_pb2
            request = json_format.ParseDict(a.get("request", {}), getattr(module, a["request_type"])())
            reply = self.raw.call(stub, a["method"], request)
            return {"reply": json_format.MessageToDict(reply, preserving_proto_field_name=True)}
        raise ValueError(f"unknown op {op!r}")


def drop_privileges(spec: str) -> None:
    """``--drop-to UID:GID``: import everything first (the interpreter and the standard library may
    be unreadable to that uid), then become it for good, as a client of another user would be."""
    import subprocess  # noqa: F401 - preloaded for the commands that use them
    import threading  # noqa: F401

    from google.protobuf import json_format  # noqa: F401

    import vtalloc.client.service_space  # noqa: F401
    import vtalloc.client.session  # noqa: F401
    from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2  # noqa: F401

    uid, gid = (int(x) for x in spec.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    assert os.getuid() == os.geteuid() == uid


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--drop-to":
        drop_privileges(sys.argv[2])
    client = Client()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "exit":
            break
        try:
            answer = {"ok": True, **client.handle(op, cmd)}
        except Exception as e:  # noqa: BLE001 - every failure is an answer the test inspects
            answer = {"ok": False, "error": type(e).__name__, "message": str(e),
                      "bases": [c.__name__ for c in type(e).__mro__]}
            if os.environ.get("VT_CLIENT_TRACE"):
                traceback.print_exc()
        print(json.dumps(answer), flush=True)
    if client.space is not None:
        client.space.close()
    if client.raw is not None:
        client.raw.close()


if __name__ == "__main__":
    main()
