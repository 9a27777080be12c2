#!/usr/bin/env bash
# The H200 lease of 2026-12-05 (tenth session; issues 60 and 62): a record of its calls, all from commit 823d75a
# (CAPGRPO_COMMIT 823d75a4...). The commands are the parts of docs/experiment-qwen15/next-lease.sh as it was at that
# commit, and docs/performance/h200-2026-12-05/probe.sh; nothing here is run again. One machine, no refused start,
# 1,730 of 1,800 s of device time held in 31 calls (throughput3/lease.json lists calls 1-30 with their clocks):
#   1 begin (t0 1796443434; 115 s held at its end, machine start included): wheels; the MPS probe detached;
#   2-26 receive 1..25 (~6-8 s held each); the probe's three parts ended at t 1796443555 (one), 652 (mps2), 763 (slice2);
#   27 start 26: join (sha256 ok), waited for the probe, plan-throughput3.yaml's launcher detached (its base
#      conversion, then the leader at t 1796443893);
#   28-29 watch 300, watch 200;
#   30 watch to the launcher's end (train wall 787 s, 4 of 4 runs at step 10), pack (rows: throughput3/), the probe's
#      JSON (probe-*.json), then S2-s913 alone started detached from a copy of the tree in /tmp (--seeds 913 --arms S2
#      --parallel 1, the trial's converted base linked);
#   31 watch the alone run to its end (train wall 341 s), `bench.resume_check --compare` of the trial's S2-s913 against
#      it (compare-S2.json: rows identical, eval rows identical), pack (rows: alone/); then the machine was given
#      back with 68 s of device time left.
echo "a record; see the header" >&2
exit 2
