"""Paired statistics and arm comparison (SPEC §7): `stats.sign_flip_test`, `compare.compare_runs`."""
