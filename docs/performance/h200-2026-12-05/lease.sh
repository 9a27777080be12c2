#!/usr/bin/env bash
# The H200 lease of 2026-12-05 (ninth session; issues 60 and 62): a record of its calls. The commands are those of
# docs/experiment-qwen15/next-lease.sh and of probe.sh beside this file; nothing here is run again.
# First machine (the first attempt to start one was refused after 91 s of device time):
#   1 detbench (t0 1796436480; machine start: 187 s held at its end): wheels received and installed, detbench started
#     detached from the repository folder;
#   2-7 receive 1..6 (~4 s held each). Call 2 showed detbench's first process failing to import
#     (`No module named 'data.eval_sets'`): the next call's copy of the tree replaced the files under it. Call 7 tried to
#     restart it, but its pkill pattern matched its own shell (rc -1);
#   8 receive 8, and detbench started again from a copy of the tree in /tmp (.carry/detloop.sh, the same loop);
#   9-25 receive 9..25; 26 waits for the det-kv variant: det 7.68 ms, det-kv 6.10 ms a decode step (same tokens);
#   here: amendment 06af5fa (plan-throughput2.yaml and the draft plan.yaml: deterministic_kv_writes true);
#   27 start 26 with CAPGRPO_COMMIT=06af5fa (t0 1796436741): join (sha256 ok), the trial detached;
#   28 the free variant waited for (5.97 ms), detbench stopped before its fourth variant, its JSON and logs into $OUT
#     (detbench-*.json/.log beside this file);
#   29 watch 150; 30 watch 200 (to t1 1796437210: S0-s910 at step 5, S2-s910 at step 3, 87 GB in use);
#   31 the runs' steps.jsonl and run.json read on the machine (micro-batch 1 row, checkpointing, basis -12.5 GiB);
#   then more than 30 s passed before the next call and the machine was released, with the trial's rows on it (held
#   920 s; docs/PERFORMANCE.md, "Seventh lease").
# Second machine: none. Four later attempts (02:38, 02:50, 03:02 and 03:28 UTC) were refused, at 90 s of device time each;
# probe.sh (its header: MPS at the 1.5B's decode shape, deterministic's cost at the 0.5B's) did not run.
echo "a record; see the header" >&2
exit 2
