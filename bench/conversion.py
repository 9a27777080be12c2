"""Time a packaged base's conversion (bases/packaged.py convert: GGUF -> float32 safetensors) into a fresh folder, and
print each written file's sha256: two conversions (other code, another transformers) that print the same hashes wrote
the same checkpoint, so the runs that load it compute the same rows.

    python -m bench.conversion qwen2.5-coder-1.5b --gguf artifacts/qwen2.5-coder-1.5b.gguf [--json out.json]

The folder is removed afterwards (a 1.5B conversion is 7.1 GB); peak memory is this process's and the tokenizer
process's largest resident set, from getrusage.
"""

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bases.packaged import MANIFEST, SOURCES, convert
from data.atomic import sha256_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(SOURCES))
    ap.add_argument("--gguf", type=Path, required=True, help="the whole (joined) GGUF")
    ap.add_argument("--dir", type=Path, default=None, help="where to convert (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="conversion.", dir=args.dir))
    try:
        t0 = time.perf_counter()
        manifest = convert(args.gguf, work / args.name, SOURCES[args.name])
        seconds = time.perf_counter() - t0
        files = {f.name: sha256_file(f) for f in sorted((work / args.name).iterdir()) if f.name != MANIFEST}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peak = {who: resource.getrusage(w).ru_maxrss / 2**20 for who, w in  # KiB -> GiB
            (("converter", resource.RUSAGE_SELF), ("tokenizer process", resource.RUSAGE_CHILDREN))}  # fmt: skip
    out = {"base": args.name, "seconds": round(seconds, 1), "peak_rss_gib": {k: round(v, 2) for k, v in peak.items()},
           "versions": manifest["versions"], "sha256": files}  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
