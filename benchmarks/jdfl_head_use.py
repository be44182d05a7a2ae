"""Does JDFL's expanded head act? The final global model of finished JDFL study runs, read from their
checkpoints, on the run's own global test set (the union of the clients' test splits): the measures of
``fedpers.algorithms.jdfl.joint_head_use`` (columns: class-only = the paper's accuracy, checked against
the run's own final evaluation in ``summary.json`` so the model read is the model judged; marginal and
differ = decoding by the class marginal and the share of samples where it disagrees with the max over
the M units, the non-linearity the paper argues for in Sec. 4.3 and Appendix A; top share; unit cosine;
own block and own-block acc).

These are diagnostics of ours (none is the paper's), to say whether the mechanism the studies judge acts
at the values used before its verdicts are read. Checkpoints are git-ignored, so this runs where the study
ran (each run directory holds ``checkpoint/server_checkpoint.npz`` of its last round):

    python benchmarks/jdfl_head_use.py --study jdfl_pacs_B_r50 \\
        /work/runs/jdfl_pacs_B_r50/runs/fedavg_jdfl=*/pacs_a1/seed*

Records are merged into benchmarks/results/jdfl_head_use.json, keyed by study and run (a record already
there is kept unless ``--force``), and the Markdown table is rewritten from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fedpers.algorithms.jdfl import joint_head_use, pseudo_domain_of_each_domain  # noqa: E402
from fedpers.core.checkpoint import load_checkpoint  # noqa: E402
from fedpers.core.training import predict_logits  # noqa: E402
from fedpers.registry.config import build_config  # noqa: E402
from fedpers.registry.methods import federation_for, strategy_class_for  # noqa: E402

OUT = HERE / "results" / "jdfl_head_use"


def measure(run_dir: Path, summary: dict) -> dict:
    """Load a JDFL run's config (from its ``summary``), federation and last-round checkpoint into its own
    strategy class and measure."""
    cfg = build_config(summary["config"])
    federation = federation_for(cfg)
    test_domains = federation.test_domains()
    if test_domains is None:
        raise SystemExit(f"{run_dir}: dataset {cfg.dataset} has no domain ids, which own block needs")
    state = load_checkpoint(run_dir / "checkpoint", cfg)
    if int(state["round"]) != cfg.rounds:
        raise SystemExit(f"{run_dir}: the checkpoint holds round {state['round']}, not the last ({cfg.rounds})")
    strategy = strategy_class_for(cfg)(cfg, federation, None)
    strategy.load_state_dict(state)
    model = strategy.model.cpu()
    test = federation.test(torch.device("cpu"))
    logits = predict_logits(model, test.x)
    info = summary["jdfl"]
    own = pseudo_domain_of_each_domain(info["assignments"], info["true_domains"])
    record = joint_head_use(logits, test.y, model.head.weight.detach(), federation.num_classes,
                            test_domains, own)
    record.update(run=str(run_dir), method=cfg.method, jdfl=cfg.jdfl, seed=cfg.seed, rounds=cfg.rounds,
                  ari=info["ari"], summary_final_acc=summary["final"]["global_acc"])
    return record


def markdown(records: dict[str, dict]) -> str:
    """The table of every record, grouped by study."""
    lines = ["# Does JDFL's expanded head act? (benchmarks/jdfl_head_use.py)", "",
             "The final global model of each finished JDFL run on its global test set; definitions in "
             "`fedpers.algorithms.jdfl.joint_head_use` (ours, not the paper's). `summary` is the run's own "
             "final class-only accuracy, which `class-only` must repeat. 1/M is chance for `own block` and "
             "the floor of `top share`. CPU.", ""]
    studies = sorted({r["study"] for r in records.values()})
    for study in studies:
        lines += [f"## {study}", "", "| run | M | ARI | summary | class-only | marginal | differ | top share "
                  "| unit cosine | own block | own-block acc |", "|---" * 11 + "|"]
        rows = sorted((r for r in records.values() if r["study"] == study),
                      key=lambda r: (r["method"], r["jdfl"], r["seed"]))
        for r in rows:
            lines.append(f"| {r['method']} + {r['jdfl']}, seed {r['seed']} | {r['M']} | {r['ari']:.2f} "
                         f"| {100 * r['summary_final_acc']:.2f} | {100 * r['class_only_acc']:.2f} "
                         f"| {100 * r['marginal_acc']:.2f} | {100 * r['decodings_differ']:.2f} "
                         f"| {r['top_share']:.3f} | {r['unit_cosine']:.3f} | {100 * r['own_block']:.1f} "
                         f"| {100 * r['own_block_acc']:.2f} |")
        lines.append("")
    lines.append("Accuracies and shares of samples in %; `top share` and `unit cosine` as fractions.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure the given runs, merge them into the JSON and rewrite the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished JDFL run directories with their checkpoints")
    p.add_argument("--study", required=True, help="the study the runs belong to (the table's group)")
    p.add_argument("--force", action="store_true", help="measure runs already in the JSON again")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out_json = OUT.with_suffix(".json")
    records: dict[str, dict] = json.loads(out_json.read_text())["records"] if out_json.exists() else {}
    for run_dir in args.runs:
        if not (run_dir / "summary.json").is_file():
            print(f"skip {run_dir}: not finished (no summary.json)")
            continue
        if not (run_dir / "checkpoint" / "server_checkpoint.npz").is_file():
            print(f"skip {run_dir}: no checkpoint/server_checkpoint.npz (its model was not kept)")
            continue
        key = f"{args.study}/{'/'.join(run_dir.parts[-3:])}"
        if key in records and not args.force:
            continue
        summary = json.loads((run_dir / "summary.json").read_text())
        if summary["config"].get("jdfl", "off") == "off":
            continue
        record = measure(run_dir, summary)
        record["study"] = args.study
        records[key] = record
        print(f"{key}: class-only {record['class_only_acc']:.4f} (summary {record['summary_final_acc']:.4f}), "
              f"top share {record['top_share']:.3f}, own block {record['own_block']:.3f}", flush=True)
        out_json.write_text(json.dumps({"records": records}, indent=1) + "\n")
    OUT.with_suffix(".md").write_text(markdown(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
