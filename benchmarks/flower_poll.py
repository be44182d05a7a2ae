"""What Flower's simulation engine spends on finding messages, by the number of nodes.

Flower 1.42's simulation (``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``) looks for
messages every 0.1 s by asking its in-memory LinkState once per registered node (``get_message_ins``), and
each of those calls scans every stored message. This script times one such sweep over 100, 1,000 and
10,000 registered nodes with no message waiting, the least it can cost, with the same Flower functions
the engine calls (``fedpers.apps.flower_internals.simulation_poll_sweep_seconds``: internal ones, kept in
the one module that may name them). The sweep runs in the
driver, next to the ServerApp, whatever the number of clients sampled per round.

    python benchmarks/flower_poll.py

Writes benchmarks/results/scale/flower_poll.md and .json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_files import write_report  # noqa: E402

from fedpers.apps.flower_internals import simulation_poll_sweep_seconds  # noqa: E402

POLL_INTERVAL = 0.1  # seconds between two sweeps in vce_api.add_messages_to_queue (Flower 1.42)


def main() -> None:
    rows = [{"nodes": n, "sweep_seconds": simulation_poll_sweep_seconds(n)} for n in (100, 1000, 10000)]
    for r in rows:
        r["share_of_one_core"] = r["sweep_seconds"] / (r["sweep_seconds"] + POLL_INTERVAL)
    lines = ["# Flower's simulation message poll, by registered nodes", "",
             "Command: `python benchmarks/flower_poll.py` (flwr 1.42, in-memory LinkState, no message waiting).", "",
             "| nodes | one sweep ms | share of one core (a sweep every 0.1 s) |", "|---|---|---|"]
    lines += [f"| {r['nodes']} | {r['sweep_seconds'] * 1e3:.1f} | {r['share_of_one_core']:.0%} |" for r in rows]
    text = "\n".join(lines) + "\n"
    write_report("scale/flower_poll", text, rows)


if __name__ == "__main__":
    main()
