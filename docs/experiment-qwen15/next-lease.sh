#!/usr/bin/env bash
# Issue 62's pairs leases, one part per call (docs/experiment-qwen15/plan.yaml, final since 2026-12-05).
# The lease of 2026-12-05 that measured the lease figure ran this file as it was at 823d75a (plan-throughput3.yaml;
# its record: docs/performance/h200-2026-12-05b/lease.sh).
# One part per device call, from the repository root, back to back: a machine is given back 30 s after a call ends.
# Here, before the lease, after the last commit (the tree's size sets each call's share): `bash $0 prepare` (~2 min on
# a fresh checkout: the 1.5B base from PyPI, MATH500 from ../shared/data, the wheels the GPU image lacks at the
# lock's versions, split into .carry/whl/call01 and .carry/q15/callKK; it prints the number of q15 calls).
# Then, right before `begin`, `bash $0 fits`: it exits 1 naming a call that no longer fits beside the grown tree
# (lease 4's fullest call had 0.5 MB to spare, and a lease's rows add ~0.5 MB); `prepare` again if it does.
# Calls, each with CAPGRPO_COMMIT set to the commit the tree is at (at or after the plan's final commit):
#   begin             starts the machine; the wheels; issue 60's bf16 probe detached while the base is carried
#                     (docs/performance/probe-bf16.sh; the start call starts the launcher, whose conversion
#                     is CPU work, then stops the probe within PROBE_WAIT_S s, default 0 since lease 2: its first
#                     part is measured on both GPU models (PERFORMANCE.md), and 40 s may be a second pair's margin;
#                     the probe's finished parts are still packed)
#   receive K         every q15 part but the last
#   start LAST SEEDS BUDGET [STEP0]   the last part, join (and the caches `begin` received); the pairs SEEDS (e.g. 0,1,2:
#                     seed order, both arms of a pair together) detached, the launcher's budget BUDGET s: the
#                     device time left less ~60 s for the pack. The plan projects ~440 s a pair and 2 whole pairs
#                     in a first lease (PLAN.md); the launcher starts a new pair only while its quickest finished run
#                     still fits the budget (a seed not started stays for the next lease); a pair that starts and
#                     does not reach step 30 is left out and rerun with the next unused seed from 100 (deviation
#                     rule 4)
#                     On an H100 (the device tool may lend one: PLAN.md, amendment 2) the same calls: the launcher
#                     runs one 1.5B run at a time there, so pass one or two pairs' seeds (a pair starts only
#                     while both its runs, one after the other, fit the budget).
#                     A later lease adds STEP0, a committed launch folder (e.g. docs/experiment-qwen15/launch1): its
#                     first run's step-0 rows are unpacked and every run copies them (`train --step0-from`; each
#                     trainer checks they are its own: same base path, snapshot, sets, caps and seeds, so W stays
#                     /tmp/q15x in every lease), saving the leader's ~150 s of step 0; taken only where that launch
#                     ran on this GPU model
#   restart SEEDS BUDGET [STEP0]   after a run of a pair in SEEDS crashed before any save (PLAN.md, amendment 3): its
#                     unfinished runs moved to $W/crashed/ (packed into $OUT/crashed.tar.xz: commit them as launchN/crashed/),
#                     then the launcher again for SEEDS (lease 4: `restart 5,6,7`); lease 2 did this by hand for S2-s1
#   watch [S]         until the launcher ends (or S s, at most the call's 570 s less 60 for the packs: lease 4's
#                     watch ended 19 s after its 560 and packed for ~30 s, past the call's limit, so no rows came
#                     back; plain `watch` is the longest safe one), then the rows so far into $OUT: should the machine be lost
#                     before `pack`, the last watch call's archive holds every pair that had finished by then; and
#                     the launch's compile caches with their key (compile-caches.tar.gz, ~3 MiB): after the lease, keep
#                     the last call's here as .carry/caches/<GPU name, non-alphanumerics as _>.tar.gz (e.g.
#                     NVIDIA_H100_80GB_HBM3.tar.gz) and carry .carry/caches with `begin` (its wheels leave ~40 MB of the call;
#                     lease 7 carried them beside the last base part, over 64 MiB, and was refused): its leader then
#                     compiles nothing an earlier lease on that GPU model compiled (lease 3's leader: ~29 s of
#                     compiling at its first step and first evaluation, from its rows against its partners')
#   pack              the rows into $OUT (<plan name>.tar.xz)
# Afterwards, here: `make launch PLAN=docs/experiment-qwen15/plan.yaml STAGE=unpack` into docs/experiment-qwen15/launchN
# with lease.json from the calls' replies (as docs/performance/h200-2026-12-05b/throughput3/lease.json), then
# `python -m rundir.archive merge docs/experiment-qwen15`: the leases' step-0 rows (copies) stored once, so the tree
# stays near 20 MB (each call carries it).
# Lease 1 (2026-12-05, an H100, launch1/) ran seed 0's pair. Its step-0 files differ from throughput3's (the H200) in
# 880 of 1,856 samples: the two GPU models compute different rows (PLAN.md, "The leases"). Lease 2 (an H100, launch2/)
# ran seed 1's pair; seed 2's pair is left out (PLAN.md, amendment 3: seed 100 runs in its place, after 15). Lease 3
# (2026-12-06, an H100, launch3/) ran seeds 3 and 4 (`start 26 3,4,5 1500 docs/experiment-qwen15/launch1`; seed 5's pair
# did not fit and was not started). Lease 4 (2026-12-06, an H100, launch4/) ran seed 5 (`start 26 5,6,7 1560 …`; its
# S0-s5 died at its first compile, the cache file's variable being named CC, which the image exports: `restart 5,6,7
# 1250 …` after it; seeds 6 and 7 did not fit). Lease 5 (2026-12-06, an H100, launch5/) ran seed 6 (`start 27 6,7,8
# 1515 docs/experiment-qwen15/launch1`, lease 4's caches carried; seeds 7 and 8 did not fit). Lease 6 (2026-12-06, an
# H100, launch6/, the first under amendment 4) ran S0-s7, S2-s7 and S0-s8 (`start 27 7,8,9,10 1665 …`, no caches:
# .carry/ is not in a new checkout); S2-s8 did not fit (378 s left against the slowest run's 446). Lease 7 (2026-12-06,
# an H100, launch7/) ran S2-s8, S0-s9, S2-s9 and S0-s10 (`start 27 8,9,10,11 1630 …`, every call nvidia-h100-x1; no
# caches: carried beside part 27 they made the call over 64 MiB, so `begin` carries them now); S2-s10 did not fit (52 s
# left). Lease 8 (2026-12-06, an H100, launch8/, after four refused starts) ran S2-s10 and S0-s11 (`start 27 10,11,12,13
# 1180 …`, lease 7's caches carried by `begin`: the leader's first step 13.1 s); S2-s11 did not fit (337 s left against
# 356). Its parts were refused at first though `fits` found 0.36 MB to spare: the device tool counts as if by each file's
# 4 KiB blocks (`fits` does now), and `prepare` split the base again at 361e5c9: N = 30 (2.1 MB to spare in the fullest
# call). Lease 9 (2026-12-06, an H100, launch9/) ran from a detached cf9d495 (S0-s11's run code; trainer/train.py
# changed on main after it: the exit hang of multi-process runs, docs/gpu.md, which one-process runs never reach):
# S2-s11, S0-s12, S2-s12 and S0-s13 (`start 30 11,12,13,14 1610 …`, lease 8's caches carried: the leader's first step
# 13.4 s); S2-s13 did not fit (185 s left against 326). Its rows were committed on the branch runs-a756faa (from
# cf9d495) and merged into main. Lease 10 (2026-12-06, an H100, launch10/) ran from that branch's tip 2bd00db: S2-s13,
# S0-s14, S2-s14 and S0-s15 (`start 30 13,14,15,100 1550 …`, lease 9's caches carried: the leader's first step 14.5 s);
# S2-s15 did not fit (23 s left against 351); its rows were committed on runs-a756faa (759f63e) and merged into main.
# The twenty-eighth session got no machine (eleven refused starts and six calls refused untried, 1,261 s of its 1,800:
# an nvidia-h100-x1 refusal cost 90 s, an nvidia-h200 one 90-180, an untried call 15; PLAN.md). Lease 11 (2026-12-07,
# an H100, launch11/, after twelve refused starts, 842 s) ran from the branch's tip b072551: S2-s15 alone, 337 s; its
# first launcher (`start 30 15,100 760 …`) started nothing, 574 s left against the 596 s of launch1's leader, and a
# launcher by hand with `--budget-s 750` ran it (PLAN.md). Its rows were committed on runs-a756faa (e9ccfea) and
# merged into main. Since then a lease's first run is measured by the committed runs on its GPU model that did step 0
# as it will ("earlier leases' runs on this GPU model that copied step 0: 29, the slowest 476 s"; 596 s for a leader
# that evaluates it).
# Lease 12 (2026-12-07, an H100 though the start asked for nvidia-h200, launch12/) ran seed 100's pair, the last, from
# main at ac76781: `start 32 100 1320 docs/experiment-qwen15/launch1`, `watch` twice. Its `begin`, asked of an H200,
# carried the wheels alone, so lease 11's compile caches took a call of their own (`mkdir -p /tmp/carry/caches && cp
# .carry/caches/*.tar.gz /tmp/carry/caches/`, carrying [".carry/caches"]) when an H100 came: `begin` should carry
# .carry/caches whatever kind is asked, since `start` takes only the file named for the GPU that came. Issue 62's 16
# pairs are complete: no lease is owed to the plan. What follows is how the leases ran, for a plan that reuses this
# script.
# Keep embedded/base/model.safetensors.xz in the tree: the launcher's base and train stages unpack the shipped files
# for every plan (lease 8's first start refused its absence). A start call that fails after its join, or whose
# launcher started nothing, may be called again on the warm machine (carrying nothing): it reuses the joined files in
# /tmp/c15 and the launcher the converted base in /tmp/q15x (lease 11 ran the launcher by hand for this, its
# `start` then joining again).
# Since amendment 4 (PLAN.md) the launcher starts a run, not a pair, while the slowest run it finished fits the time
# left, so a lease may end with a pair's S0 done and its S2 waiting: the next lease passes the same seeds (e.g.
# `start 27 7,8,9,10 ...`; `--committed-in docs/experiment-qwen15` drops the runs already committed, so the waiting
# S2 goes first), is asked for the same GPU model (run's kind nvidia-h100-x1 for an H100: not nvidia-h200, which may
# lend an H200), and runs at a commit with the same run code (no change under trainer/, engine/, rewards/, data/,
# bases/, launch/settings.py, the recipe, plan.yaml or the lock while a partner waits; tests/test_qwen15_experiment.py).
# The first H200 lease's step-0 files are still the free check of the code since the trial (823d75a): same base bytes,
# eval seeds and sets, so they must equal throughput3's byte for byte.
# A leader given STEP0 runs alone until its first row; the GPU is then sized by the most the step-0 rows' own run held
# (launch1's S0-s0: 54.6 GiB, so one run at a time on an H100, two on an H200; launch/gpus.py `Gpu.memory_from`). Where
# that run copied its step 0 too, the leader runs alone until its row after step 10's evaluation (amendment 3's fix).
# Before `begin`: a pair needs ~920 s of budget on an H100 with STEP0 (lease 2's parts: start 29, carry 111, start call
# and conversion ~70, two runs ~330 each, pack); with less left, start no pair (no seed is used up; PLAN.md, "No lease 3").
# A start may charge more: 97 and 88 s on 2026-12-06 (PLAN.md, "No lease 3, again"), ~990 s for the pair then.
# Lease 3's parts: start 36 s of budget, carry ~181 s (7.2 s a call), start call 42, conversion 34, runs 295-376 s
# each: two pairs in 1,660 s of budget (launch3/lease.json). Lease 4's runs took 476 and 391 s (seed 5's gate refilled
# more): a lease holds one or two pairs, by its seeds. Watch with plain `watch` (the longest call that still packs).
# Kill by a pattern that cannot match the calling shell: pkill -9 -f '^[^ ]*python3? -m trainer[.]train'.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "t0 $(date +%s)"; trap 'echo "t1 $(date +%s)"' EXIT
PLAN=docs/experiment-qwen15/plan.yaml W=/tmp/q15x
left() { echo $((570 - SECONDS)); }
step0() {  # S0: --step0-from the first run of the launch folder $1, only from runs on this GPU model (amendment 2)
  S0=(); [ -n "$1" ] || return 0
  [ -d /tmp/step0src ] || python3 -m rundir.archive unpack $1 /tmp/step0src > /dev/null || exit 1
  src=$(ls /tmp/step0src/*/results/eval_step000.jsonl | head -1)
  there=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['launch'].get('device'))" ${src%/results/*}/run.json)
  here=$(python3 -c "import torch; print(torch.cuda.get_device_name())")
  if [ "$there" = "$here" ]; then S0=(--step0-from $src); else echo "step 0 evaluated here: $1 ran on $there, this is $here"; fi
}
case ${1:-} in
prepare)  # here, not on the GPU machine
  make real-base MODEL=qwen2.5-coder-1.5b || exit 1   # artifacts/qwen2.5-coder-1.5b.gguf, artifacts/real/gsm_symbolic.tasks.json
  cp ../shared/data/math500.jsonl artifacts/real/ || exit 1   # an ignored path: the shared copy is the one kept
  make gpu-wheels && rm -rf .carry/whl .carry/q15 || exit 1   # .whl/: what the GPU image lacks, at the lock's versions
  .venv/bin/python tools/carry.py split .whl/*.whl --name whl || exit 1
  .venv/bin/python tools/carry.py split artifacts/qwen2.5-coder-1.5b.gguf artifacts/real/gsm_symbolic.tasks.json \
    artifacts/real/math500.jsonl --name q15 || exit 1
  echo "q15 calls: $(ls .carry/q15 | wc -l) (receive 1..N-1, then start N)" ;;
fits)  # here, right before `begin`: every call still fits beside the tree, which each lease's rows grow (else prepare)
  .venv/bin/python tools/carry.py fits whl --with .carry/caches && .venv/bin/python tools/carry.py fits q15 || exit 1
  # .carry/ is not in a new checkout: without an earlier lease's caches the leader compiles (~55 s; lease 6)
  ls .carry/caches/*.tar.gz 2>/dev/null || echo "no compile caches in .carry/caches: the leader compiles everything" ;;
begin)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 tools/carry.py receive .carry/whl/call01 && python3 tools/carry.py join whl --out /tmp/cw > $OUT/joinw.log 2>&1 || { cat $OUT/joinw.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps /tmp/cw/*.whl > $OUT/wheels.log 2>&1 || { cat $OUT/wheels.log; exit 1; }
  # the compile caches ride here, where the wheels leave room; /tmp lasts while the calls follow within 30 s
  mkdir -p /tmp/carry/caches && { cp .carry/caches/*.tar.gz /tmp/carry/caches/ 2>/dev/null; ls /tmp/carry/caches; }
  mkdir -p /tmp/probe/repo && tar --exclude=./.carry -cf - . | tar -xf - -C /tmp/probe/repo
  (cd /tmp/probe/repo && PYTHONPATH=/tmp/probe/repo setsid bash docs/performance/probe-bf16.sh > /tmp/probe/probe.log 2>&1 < /dev/null &) ;;
receive)  # receive K
  python3 tools/carry.py receive .carry/q15/call$(printf %02d $2) ;;
start)  # start LAST SEEDS BUDGET [STEP0]
  # a start again on a warm machine reuses the join (written whole or not at all; its parts are gone, and part N's
  # carried folder stays on the machine, so lease 11's second `start` joined again and failed)
  if [ ! -f /tmp/c15/qwen2.5-coder-1.5b.gguf ]; then
    python3 tools/carry.py receive .carry/q15/call$(printf %02d $2) && python3 tools/carry.py join q15 --out /tmp/c15 > $OUT/join.log 2>&1 || { cat $OUT/join.log; exit 1; }
  fi
  mkdir -p artifacts/real && cp /tmp/c15/gsm_symbolic.tasks.json /tmp/c15/math500.jsonl artifacts/real/
  echo "joined at +$SECONDS s"  # the call's parts, timed (lease 4's took 53 s to the launcher, lease 3's ~25)
  step0 "${5:-}"; echo "step-0 rows at +$SECONDS s"
  # an earlier lease's compile caches for this GPU model, where carried (`launch train --caches` checks their key)
  CACHE_FILE=/tmp/carry/caches/$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' _).tar.gz
  CACHES=(); [ -f "$CACHE_FILE" ] && CACHES=(--caches $CACHE_FILE)
  # the launcher first: its base conversion is CPU work (>= 45 s), in which the probe may finish on the GPU
  python3 -m launch $PLAN train --work $W --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --seeds $3 --budget-s $4 "${S0[@]}" "${CACHES[@]}" \
    --committed-in docs/experiment-qwen15 --detach  # a run an earlier lease committed is not run again (amendment 4)
  echo "launcher started at +$SECONDS s"
  for _ in $(seq ${PROBE_WAIT_S:-0}); do grep -q '^eval-bf16-1152 ' /tmp/probe/done 2>/dev/null && break; sleep 1; done
  cat /tmp/probe/done; pkill -9 -f 'bench[.]generation'
  mkdir -p /tmp/pj && for f in /tmp/probe/*/generation.json; do cp $f /tmp/pj/$(basename $(dirname $f)).json; done
  cp /tmp/probe/*.log /tmp/pj/ 2>/dev/null; tar -C /tmp/pj -czf $OUT/probe-bf16.tar.gz .
  sleep 5; python3 -m launch $PLAN watch --work $W --for-s 1 ;;
restart)  # restart SEEDS BUDGET [STEP0]
  mkdir -p $W/crashed
  for run in $(for s in ${2//,/ }; do ls -d $W/runs/qwen15-S?-s$s 2>/dev/null; done); do
    [ "$(wc -l < $run/results/steps.jsonl 2>/dev/null || echo 0)" -ge 30 ] && continue
    [ -e $W/crashed/$(basename $run) ] && { echo "$W/crashed/$(basename $run): exists (a second crash); keep it first"; exit 1; }
    mv $run $W/crashed/ && mv $W/runs/$(basename $run).log $W/crashed/ && echo "moved aside: $(basename $run)"
  done
  tar -C $W -cJf $OUT/crashed.tar.xz crashed || exit 1
  step0 "${4:-}"
  python3 -m launch $PLAN train --work $W --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --seeds $2 --budget-s $3 "${S0[@]}" \
    --committed-in docs/experiment-qwen15 --detach
  sleep 5; python3 -m launch $PLAN watch --work $W --for-s 1 ;;
watch)  # watch [S]: S capped to leave the packs 60 s of the call (lease 4's `watch 560` ran past 600 s; no rows came back)
  S=$(($(left) - 60)); [ -n "${2:-}" ] && [ "$2" -lt "$S" ] && S=$2
  python3 -m launch $PLAN watch --work $W --for-s $S
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  python3 -m launch $PLAN pack --work $W --out $OUT --with-caches ;;
pack)
  python3 -m launch $PLAN pack --work $W --out $OUT --with-caches ;;
*) echo "unknown part ${1:-}"; exit 2 ;;
esac
