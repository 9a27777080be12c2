"""Benchmarks and checks run by hand or on the lent GPU machine, each as `python -m bench.<name>` from the repo
root (bench/README.md); tests import their logic. Not part of the product: nothing outside bench/ and tests/
imports it."""

import os

# Before any bench module imports transformers: local models only (an explicit setting wins)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
