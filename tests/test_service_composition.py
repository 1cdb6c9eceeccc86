"""The daemon's objects hold their parts; none is built by an inheritance chain.

The ledger used to be 44 methods built by a 7-level chain of mixins (LedgerViews over
LedgerVictims over ... over LedgerBooks) and the node 23 over 5 levels; each part now is a
class of its own, handed the parts it uses at construction, and ``Ledger`` and ``Node`` are
small facades that build and hold them (docs/design.md, "Layers"). These tests fail if a
chain comes back: a class of server/ whose base is another class of server/, other than the
exceptions of the one hierarchy and the cases listed in ALLOWED with their reason.
"""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

from helpers.sizes import PAGE
from vtalloc.server.ledger import Ledger, NodeGeometry
from vtalloc.server.node import Node

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server"
# (file, class, base): why this class of server/ may have that base of server/.
ALLOWED = {
    ("server/metrics.py", "Server", "_BoundedServer"):
        "socketserver takes the address family as a class attribute: one subclass made per family at start",
}
MAX_FACADE_METHODS = 2  # what Ledger and Node may add beyond building their parts


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ["vtalloc", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(expr: ast.expr, namespace: dict) -> object:
    """The object a base expression names in its module (a name, or a dotted attribute)."""
    if isinstance(expr, ast.Name):
        return namespace[expr.id] if expr.id in namespace else vars(builtins)[expr.id]
    if isinstance(expr, ast.Attribute):
        return getattr(_resolve(expr.value, namespace), expr.attr)
    if isinstance(expr, ast.Subscript):   # Generic[T], Sequence[int]: the class subscripted
        return _resolve(expr.value, namespace)
    raise KeyError(ast.unparse(expr))


def inheritance_findings(rel: str, text: str, namespace: dict) -> list[str]:
    """Every class in ``text`` (nested ones too) whose base is a class of vtalloc.server (the
    generated stubs aside), unless it is an exception or listed in ALLOWED; a base that
    cannot be resolved is a finding too, so nothing passes unseen."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ClassDef):
            continue
        for expr in node.bases:
            try:
                base = _resolve(expr, namespace)
            except (KeyError, AttributeError):
                found.append(f"{rel}:{node.lineno}: {node.name}: base {ast.unparse(expr)} not resolved")
                continue
            module = getattr(base, "__module__", "") or ""
            if not isinstance(base, type) or not module.startswith("vtalloc.server") \
                    or module.startswith("vtalloc.server.proto"):
                continue
            if issubclass(base, BaseException) or (rel, node.name, base.__name__) in ALLOWED:
                continue
            found.append(f"{rel}:{node.lineno}: {node.name} inherits from {module}.{base.__name__}: "
                         "hold it as a part instead (or list it in ALLOWED with the reason)")
    return found


def _server_files() -> list[Path]:
    return sorted(p for p in SERVER.rglob("*.py") if p.relative_to(SERVER).parts[0] != "proto")


def test_the_ledger_and_the_node_are_no_chain():
    assert Ledger.__mro__ == (Ledger, object)
    assert Node.__mro__ == (Node, object)


def test_the_ledger_and_the_node_hold_their_parts():
    ledger = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0))
    parts = {name: type(v).__name__ for name, v in vars(ledger).items()}
    assert parts == {"geometry": "NodeGeometry", "books": "LedgerBooks", "sessions": "LedgerSessions",
                     "reports": "LedgerReports", "quotas": "LedgerQuotas", "leases": "LedgerLeases",
                     "victims": "LedgerVictims", "views": "LedgerViews"}
    node = Node(None, ledger)  # type: ignore[arg-type] - no page pool: nothing is leased here
    assert {type(v).__name__ for v in vars(node).values()} >= {
        "NodeChanges", "NodeReclaim", "NodePeers", "NodeConnections", "NodePressure", "NodeLeases"}
    assert node.ledger is ledger
    for cls in (Ledger, Node):
        methods = [n for n, v in vars(cls).items() if callable(v) and not n.startswith("__")]
        assert len(methods) <= MAX_FACADE_METHODS, (cls.__name__, methods)


def test_no_class_of_the_daemon_inherits_from_another():
    findings = []
    for path in _server_files():
        module = importlib.import_module(_module_of(path))
        findings += inheritance_findings(path.relative_to(ROOT).as_posix(), path.read_text(), vars(module))
    assert not findings, "\n".join(findings)


def test_the_check_sees_a_chain_and_lets_exceptions_and_the_listed_cases_pass():
    from vtalloc.server import ledger_books, metrics
    from vtalloc.server.protocol import errors

    made_up = "class Quotas(LedgerBooks):\n    pass\nclass Short(errors.ServiceError):\n    pass\n" \
              "class Server(_BoundedServer):\n    pass\ndef f():\n    class Inner(LedgerBooks):\n        pass\n"
    namespace = {"LedgerBooks": ledger_books.LedgerBooks, "errors": errors, "_BoundedServer": metrics._BoundedServer}
    found = inheritance_findings("server/metrics.py", made_up, namespace)
    assert [f.split(":")[1] for f in found] == ["1", "8"], found     # the chain, nested too; not the others
    assert inheritance_findings("server/x.py", "class A(Unknown):\n    pass\n", {})  # unresolved: a finding
    assert inheritance_findings("server/x.py", "class Server(_BoundedServer):\n    pass\n", namespace)
