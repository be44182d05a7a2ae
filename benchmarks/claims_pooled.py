"""The claims several studies share, pooled over them: the same paper claim judged in different settings
(JDFL's FedAvg claims on PACS settings A, B and C, say), every (study, seed) difference a unit, by
``fedpers.apps.claims.pool_claims``. A reading of ours across settings, beside each study's own verdicts
(which stay the claims' verdicts); it reads only the studies' committed ``claims.json``:

    python benchmarks/claims_pooled.py --out benchmarks/results/jdfl_pacs_pooled \\
        benchmarks/results/jdfl_pacs_A_r50 benchmarks/results/jdfl_pacs_B_r50 benchmarks/results/jdfl_pacs_C_r50

Writes ``<out>.md`` and ``<out>.json``, derived files rewritten on each run (run it again after
``fedpers report`` changes a study's claims).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fedpers.apps.claims import pool_claims, pooled_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Read each study's claims.json, pool the shared claims, write the Markdown and JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("studies", nargs="+", type=Path, help="study results directories, each with its claims.json")
    p.add_argument("--out", required=True, type=Path, help="path of the outputs without the suffix")
    p.add_argument("--title", default="", help="the Markdown's title (default: the out name)")
    args = p.parse_args(argv)
    if len(args.studies) < 2:
        p.error("pooling needs two or more studies")
    studies = {}
    for d in args.studies:
        path = d / "claims.json"
        if d.name in studies:
            p.error(f"{d}: a second study named {d.name}")
        if not path.exists():
            p.error(f"{d}: no claims.json (run `fedpers report` on the study first)")
        try:
            studies[d.name] = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            p.error(f"{path}: not JSON ({e})")
    try:
        pooled, left_out = pool_claims(studies)
    except (KeyError, TypeError, AttributeError, IndexError):
        p.error("a claims.json not in the form `fedpers report` writes; run the report on each study again")
    if not pooled:
        p.error("the studies share no claim to pool")
    title = args.title or f"Claims pooled over {', '.join(studies)}"
    args.out.with_suffix(".json").write_text(json.dumps({"studies": list(studies), "pooled": pooled,
                                                         "left_out": left_out}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(pooled_markdown(pooled, left_out, title))
    for entry in pooled:
        for r in entry["readings"]:
            for c in r["comparisons"]:
                span = f"{c['low']:+.2f} to {c['high']:+.2f}" if "low" in c else "no interval"
                print(f"{entry['id']:40s} {r['value']:6s} {c.get('diff', float('nan')):+6.2f} ({span}, n={c['n']}) "
                      f"{c['verdict']}")
    print(f"wrote {args.out.with_suffix('.md')} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
