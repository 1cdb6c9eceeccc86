"""soak: the reliability campaigns of issue 11, with a size knob, writing one JSON file.

Owns: the command line, which campaigns run, and the JSON record (provenance included).
Campaigns (benchmarks/reliability/): ``api`` hostile inputs to the Python API and the C ABI;
``service`` hostile gRPC requests and side-channel messages to a live daemon; ``faults`` a
failure injected at every backend call site each public operation reaches; ``kills`` SIGKILL
of clients at each lease stage and of the daemon; ``concurrency`` processes x threads x
operations against one daemon.
Invariants: a campaign's "other" outcomes (crash, hang, untyped error, wrong answer, lost
byte, leak) are counted, never hidden; the exit status is 1 when any is nonzero (findings
recorded as known and open are listed apart and do not fail the run).

Run from the repository root:
    python benchmarks/soak.py --quick                # the bounded run CI and tests/test_reliability.py use
    python benchmarks/soak.py --scale 3 --out /tmp/soak.json   # the run RELIABILITY.md reports
    python benchmarks/soak.py --only api,faults --quick
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path
from typing import Any

from lib.provenance import git_info, machine_info

CAMPAIGNS = ("api", "service", "faults", "kills", "concurrency", "round3")


def _plain(value: Any) -> Any:
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def others(record: Any) -> int:
    """Every "other" count in a campaign's record, summed (the figure that must be 0)."""
    if isinstance(record, dict):
        own = record.get("other", 0) if isinstance(record.get("other"), int) else 0
        return own + sum(others(v) for k, v in record.items() if k not in ("total", "known_open"))
    if isinstance(record, list):
        return sum(others(v) for v in record)
    return 0


def run_campaign(name: str, scale: int, seed: int) -> dict[str, Any]:
    if name == "api":
        from reliability import hostile_api as mod
    elif name == "service":
        from reliability import hostile_service as mod
    elif name == "faults":
        from reliability import faults as mod
    elif name == "kills":
        from reliability import kills as mod
    elif name == "round3":
        from reliability import hostile_round3 as mod
    else:
        from reliability import concurrency as mod
    t0 = time.monotonic()
    out = _plain(mod.run(scale, seed))
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the bounded run (scale 1)")
    size.add_argument("--scale", type=int, default=None, help="rounds per campaign (default 5)")
    ap.add_argument("--only", default=",".join(CAMPAIGNS), help="comma-separated campaigns")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default="benchmarks/results/soak-{date}.json")
    args = ap.parse_args(argv)
    scale = 1 if args.quick else (args.scale or 5)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(CAMPAIGNS)
    if unknown:
        ap.error(f"unknown campaign(s) {sorted(unknown)}; known: {', '.join(CAMPAIGNS)}")
    record: dict[str, Any] = {"scale": scale, "seed": args.seed, "command": " ".join(["python", *sys.argv]),
                              "date": _dt.date.today().isoformat(),
                              "provenance": {"machine": machine_info(), "git": git_info()}, "campaigns": {}}
    for name in names:
        record["campaigns"][name] = run_campaign(name, scale, args.seed)
        n = others(record["campaigns"][name])
        print(f"{name}: {record['campaigns'][name]['seconds']} s, other outcomes: {n}", flush=True)
    record["other_total"] = others(record["campaigns"])
    out = Path(args.out.format(date=record["date"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}; other outcomes in all: {record['other_total']}")
    return 1 if record["other_total"] else 0


if __name__ == "__main__":
    sys.exit(main())
