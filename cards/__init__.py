"""Generated model cards for checkpoints and runs, and the Hub push of a run (SPEC §8).

`cards.card`: `write_cards` (CLI `python -m cards.card`); `cards.checkpoint_card`, `cards.run_card`,
`cards.policy_text`, `cards.metadata`, `cards.cleanup`; `cards.push`: `plan_push`, `push` (CLI `python -m cards.push`).
"""
