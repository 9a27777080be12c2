"""Do two generation backends evaluate one checkpoint alike? Two eval files of the same step and seeds (say an
in-training evaluation through vLLM and one through our compiled generation), paired sample by sample:

    python -m bench.eval_backends VLLM/eval_step000.jsonl OURS/eval_step000.jsonl --labels vllm,ours [--out F.json]

Per eval set and outcome: each file's share, the difference, and the paired exact sign-flip p over samples
(analysis/stats.py; with 0/1 outcomes it is McNemar's exact test). Same seeds do not give the same tokens across
backends (different kernels and samplers), so agreement means "within sampling error", not equal rows.
"""

import argparse
import json
from pathlib import Path

from analysis.stats import sign_flip_test
from rewards.outcome import Outcome
from rundir.files import read_jsonl


def compare(a: list[dict], b: list[dict]) -> dict:
    """{set: {"samples", "identical_completions", outcome: {"a", "b", "diff", "p"}}} over the samples both hold;
    rows must share (task_id, sample, seed) one to one, or ValueError names the first that does not."""
    key = lambda r: (r["set"], r["task_id"], r["sample"])  # noqa: E731
    by_key = {key(r): r for r in b}
    if len(by_key) != len(b) or len(a) != len(b):
        raise ValueError(f"the two files hold {len(a)} and {len(b)} rows, not the same samples once each")
    out: dict[str, dict] = {}
    for r in a:
        other = by_key.get(key(r))
        if other is None or other["seed"] != r["seed"]:
            raise ValueError(f"sample {key(r)} has no partner with seed {r['seed']} in the second file")
        out.setdefault(r["set"], []).append((r, other))
    result = {}
    for name, pairs in sorted(out.items()):
        row = {
            "samples": len(pairs),
            "identical_completions": sum(x["completion"] == y["completion"] for x, y in pairs),
        }
        for outcome in (o.value for o in Outcome):
            d = [(x["outcome"] == outcome) - (y["outcome"] == outcome) for x, y in pairs]
            share_a = sum(x["outcome"] == outcome for x, _ in pairs) / len(pairs)
            share_b = sum(y["outcome"] == outcome for _, y in pairs) / len(pairs)
            p = sign_flip_test(d).p_value if any(d) else 1.0
            row[outcome] = {"a": share_a, "b": share_b, "diff": share_a - share_b, "p": p}
        result[name] = row
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--labels", default="a,b")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    la, lb = args.labels.split(",")
    result = compare(read_jsonl(args.a), read_jsonl(args.b))
    print(f"| set | outcome | {la} | {lb} | {la} − {lb} | paired p |\n|---|---|---|---|---|---|")
    for name, row in result.items():
        for outcome in (o.value for o in Outcome):
            x = row[outcome]
            print(
                f"| {name} | {outcome} | {x['a']:.1%} | {x['b']:.1%} | {100 * x['diff']:+.1f} pp | {x['p']:.3g} |"
            )
    for name, row in result.items():
        print(f"{name}: {row['samples']} samples, {row['identical_completions']} identical completions")
    if args.out:
        args.out.write_text(
            json.dumps({"a": str(args.a), "b": str(args.b), "labels": [la, lb], "sets": result}, indent=1)
        )
    return result


if __name__ == "__main__":
    main()
