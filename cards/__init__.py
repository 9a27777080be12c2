"""Generated model cards for checkpoints and runs, and the Hub push of a run (SPEC §8).

`cards.card`: `write_cards`, `checkpoint_card`, `run_card`, `scrub_checkpoint_dir`, `CardCallback`.
`cards.push`: `plan_push`, `push`. Both are also CLIs (`python -m cards.card`, `python -m cards.push`).
"""
