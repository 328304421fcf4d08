#!/usr/bin/env bash
# Re-measure what the README quotes for the default pair (issue 13, item 5), as one resumable job:
# profiles, every trace file, the shipped experiments' policies and the batch policy, the evaluations, the
# README's benchmarks and the load test. Run it after the default pair's draft changes, with nothing else on
# the machine (every number is wall-clock):
#
#   nohup bash scripts/remeasure.sh [STAGE ...] > /tmp/remeasure.log 2>&1 &
#
# STAGE: profiles traces policies evaluations speedup load fp32 benchmarks retarget (default: all nine, in this order;
# later stages read what earlier ones wrote; speedup is the headline benchmark, benchmarks the README's others; fp32
# the load-aware policies against the schedule at float32, with a profile, policies and schedule of its own;
# retarget replays the quickstart policy under other machines' profiles: one measured here with one thread, the
# slow Xeon's (committed), three derived what-ifs).
# Each step logs to benchmarks/results/remeasure/STAGE-NAME.log and is marked done (STAGE-NAME.done) when it
# exits 0, so a killed run continues where it stopped (the pair benchmark within its step, from its partial files);
# delete a .done file to redo that step. A step whose output is missing runs again even when done. DTYPE
# (default auto) is the precision of every step; DRY_RUN=1 prints the steps only; ONLY="STAGE-NAME ..." runs only
# those steps (e.g. ONLY="traces-test traces-val-tree" to fit what is left of a session).
# To run other work beside it without landing inside a timed generation: `touch runs/pause` (the live measurements of
# speedup, evaluations and benchmarks wait between generations while it exists; "paused" in the step's log), then `rm runs/pause`.
# Policies are fitted to the profiles, and every stage after them judges those policies live or times against the
# profiles, so those stages run only on hardware like the profiles' (`adaptive profile --check`; exit 3 otherwise), and
# re-measured profiles mark every step after them to be run again. Every policy the later stages judge is kept in
# benchmarks/kept-policies/NAME (committed; runs/ is not), so a fresh clone on the same kind of machine resumes without
# re-training; retarget alone re-trains from the quickstart run's checkpoints in runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
A=.venv/bin/adaptive
PY=.venv/bin/python
PAIR=smollm2-135m
DTYPE=${DTYPE:-auto}
LOG=benchmarks/results/remeasure
OUTPUTS=$LOG/outputs
KEEP=benchmarks/kept-policies  # not benchmarks/policies: a folder there would shadow the policies package in benchmark scripts
STAGES=(profiles traces policies evaluations speedup load fp32 benchmarks retarget)
mkdir -p "$LOG"

step() {
  # step NAME [--creates PATH] COMMAND...: run COMMAND once (skipped when NAME.done exists and PATH, if given,
  # exists too), its output in NAME.log; NAME.running marks a run under way, so a run killed (or failed) part way,
  # when started again, appends to its log instead of overwriting what the first part printed.
  local name="$STAGE-$1" creates=""
  shift
  if [[ "$1" == "--creates" ]]; then
    creates=$2
    shift 2
  fi
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then
    echo "not in ONLY: $name"
    return
  fi
  if [[ -e "$LOG/$name.done" ]]; then
    if [[ -z "$creates" || -e "$creates" ]]; then
      echo "done already: $name"
      return
    fi
    echo "$name was done, but $creates is missing: running it again"
  fi
  echo "$(date -u +%FT%TZ) $name: $*"
  [[ -n "${DRY_RUN:-}" ]] && return
  RAN=1
  local start=$SECONDS
  if [[ -e "$LOG/$name.running" ]]; then
    echo "=== $(date -u +%FT%TZ) started again after a kill or a failure" >> "$LOG/$name.log"
  else
    : > "$LOG/$name.log"
  fi
  touch "$LOG/$name.running"
  "$@" >> "$LOG/$name.log" 2>&1 || { echo "FAILED: $name (exit $?; see $LOG/$name.log)"; exit 1; }
  rm "$LOG/$name.running"
  echo "$(date -u +%FT%TZ) $name: done in $((SECONDS - start)) s" | tee "$LOG/$name.done"
}

profiles() {
  # 15 repetitions, not the default 7: with 7 the bf16 chain profile of 2026-12-02 had g(3) = 1.44 above g(4) = 1.28
  # (IQRs about ±15 %), which pulled the policies fitted on it away from the depths that pay live
  RAN=""
  step chain $A profile --pair $PAIR --dtype "$DTYPE" --repetitions 15 --out profiles/$PAIR.json
  step tree $A profile --pair $PAIR --dtype "$DTYPE" --tree-mask --max-verify 64 --out profiles/$PAIR-tree.json
  step batched $A profile --pair $PAIR --dtype "$DTYPE" --batches 1,2,4,8,16 --max-verify 7 --repetitions 15 --out profiles/$PAIR-batch.json
  if [[ -n "$RAN" ]]; then
    echo "new profiles: every step fitted to or judged against the old ones will run again"
    rm -f "$LOG"/{policies,evaluations,speedup,load,benchmarks,retarget}-*.done
  fi
}

on_profiled_machine() {
  # exit 3 unless the profiles were measured on hardware like this machine's
  [[ -n "${DRY_RUN:-}" ]] && return
  local profile verdict
  for profile in profiles/$PAIR.json profiles/$PAIR-tree.json profiles/$PAIR-batch.json; do
    verdict=$($A profile --check "$profile") && continue
    echo "$verdict"
    echo "stage $STAGE judges policies fitted to $profile: measure the profiles here first (rm $LOG/profiles-*.done; then bash scripts/remeasure.sh)"
    exit 3
  done
}

traces() {
  # The target's greedy answer to every workload prompt, in batches of 64 (minutes, where one decoder run per
  # prompt takes hours); each greedy recording checks them with one teacher-forced forward and regenerates
  # an answer from its first token that disagrees (a near-tie at bf16; "given outputs repaired" in its log).
  step outputs $A distill-data --pool data/workload/prompts.jsonl --out "$OUTPUTS" --dtype "$DTYPE"
  local split
  for split in val train test; do
    step "$split" $A record --pair $PAIR --dtype "$DTYPE" --split "$split" --outputs "$OUTPUTS"
  done
  step test-copy $A record --pair $PAIR --dtype "$DTYPE" --depth 8 --copy --split test --outputs "$OUTPUTS" --out data/traces/$PAIR-test-copy.npz
  for split in train val; do
    step "$split-copy" $A record --pair $PAIR --dtype "$DTYPE" --depth 8 --copy --split "$split" --task all --per-language 40 \
      --outputs "$OUTPUTS" --out data/traces/$PAIR-$split-copy.npz
  done
  step test-tree $A record --pair $PAIR --dtype "$DTYPE" --split test --tree 4,4,8 --depth 6
  step val-tree $A record --pair $PAIR --dtype "$DTYPE" --split val --tree 4,4,8 --depth 6
  step train-tree $A record --pair $PAIR --dtype "$DTYPE" --split train --tree 4,4,8 --depth 6 --per-language 100
  step test-t0.7 $A record --pair $PAIR --dtype "$DTYPE" --split test --per-language 8 --temperature 0.7 --samples 4 --depth 8 \
    --out data/traces/$PAIR-test-t0.7.npz
}

policies() {
  local config
  for config in quickstart tree copy copy-model-only cotrain; do
    step "$config" --creates "$KEEP/$(run_name "$config")/policy.json" train_kept "$config"
  done
  step batch --creates $KEEP/batch-rounds/policy.json train_batch_kept batch-rounds
  step batch-cap --creates $KEEP/batch-rounds-cap/policy.json train_batch_kept batch-rounds-cap --cap-at-schedule
  # deciding before each draft step, inside the schedule (several decisions per round, noisier: 2M steps)
  step batch-step --creates $KEEP/batch-step/policy.json train_batch_kept batch-step --per-step --cap-at-schedule --timesteps 2000000
}

run_name() {
  sed -n 's/^name: *//p' "experiments/$1.yaml"
}

train_kept() {
  # train_kept CONFIG: PPO from experiments/CONFIG.yaml on the chain profile; its final policy kept in $KEEP/NAME
  local name
  name=$(run_name "$1")
  $A train "experiments/$1.yaml" --profile profiles/$PAIR.json
  keep "$name" "runs/$name-latest/final"
}

train_batch_kept() {
  # train_batch_kept NAME [OPTION ...]: the load-aware batch policy, PPO in batched replay of the val traces; kept in $KEEP/NAME
  # (an OPTION given again, e.g. --timesteps, overrides the default before it)
  local name=$1
  shift
  $A train-batch --batch-profile profiles/$PAIR-batch.json --traces val --timesteps 200000 --seeds 2 "$@" --out "runs/$name"
  keep "$name" "runs/$name"
}

keep() {
  # keep NAME FOLDER: the policy in FOLDER (sidecar and weights) copied to $KEEP/NAME
  mkdir -p "$KEEP/$1" && cp "$2/policy.json" "$2/policy.safetensors" "$KEEP/$1/"
}

evaluations() {
  # into benchmarks/results/evaluations/NAME (committed; its W&B folder is not), where a killed evaluation resumes
  local out=benchmarks/results/evaluations
  step quickstart $A evaluate experiments/quickstart.yaml --policy $KEEP/quickstart --profile profiles/$PAIR.json --live-per-language 2 \
    --out $out/quickstart
  step tree $A evaluate experiments/tree.yaml --policy $KEEP/tree --policy $KEEP/quickstart \
    --profile profiles/$PAIR-tree.json --live-per-language 2 --out $out/tree
  step copy $A evaluate experiments/copy.yaml --policy $KEEP/copy-sources --policy $KEEP/copy-model-only \
    --profile profiles/$PAIR.json --live-per-language 12 --out $out/copy
}

speedup() {
  # greedy, then T = 0.7, each its own step and report: a session that ends during the second keeps the first's report
  local policies=static:1,static:2,static:3,static:4,static:5,static:6,static:8,heuristic,confidence,entropy,costmodel,$KEEP/quickstart
  step pair-speedup $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --per-language 8 --task every --repeats 2 --temperatures 0 \
    --policies $policies --out benchmarks/results/pair_speedup
  step pair-speedup-t0.7 $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --per-language 8 --task every --repeats 2 --temperatures 0.7 \
    --policies $policies --out benchmarks/results/pair_speedup_t0.7
  # the learned policy against the best static depths on three times the prompts (one run each: between prompts the
  # texts differ far more than between runs, so prompts narrow the interval more than repeats do)
  step pair-learned $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --per-language 24 --task every --repeats 1 --temperatures 0 \
    --no-transformers --policies static:4,static:5,static:6,$KEEP/quickstart --out benchmarks/results/pair_learned
  # the same with a policy trained on a profile of the day it is judged (kept by hand: see $KEEP/README.md)
  step pair-learned-20261204 $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --per-language 24 --task every --repeats 1 \
    --temperatures 0 --no-transformers --policies static:4,static:5,static:6,$KEEP/quickstart,$KEEP/quickstart-20261204 \
    --out benchmarks/results/pair_learned_20261204
}

benchmarks() {
  # trees for the depths that matter and the learned depth policy (the learned tree policy is judged by evaluations-tree);
  # every policy of the run above with trees would double it
  step pair-speedup-tree $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --per-language 8 --task every --repeats 2 --temperatures 0 --no-transformers \
    --policies static:2,static:3,static:4,$KEEP/quickstart --tree 4,4,8 --out benchmarks/results/pair_speedup_tree
  step generate-route $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --per-language 2 --repeats 2 --temperatures 0 \
    --policies heuristic,static:2,$KEEP/quickstart --generate-route --out benchmarks/results/generate_route
  step copy-heavy $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --temperatures 0 --per-language 4 --repeats 2 --no-transformers \
    --task copy-heavy --copy --policies static:2,static:4,static:8:copy,static:4:copy+model,suffix --out benchmarks/results/copy_sources_copyheavy
  step copy-general $PY benchmarks/pair_speedup.py --dtype "$DTYPE" --temperatures 0 --per-language 2 --repeats 2 --no-transformers \
    --copy --policies static:2,static:4,static:8:copy,static:4:copy+model,suffix --out benchmarks/results/copy_sources_general
  # the replay benchmarks decode at their traces' dtype
  step replay-vs-live $PY benchmarks/replay_vs_live.py --per-language 2
  step replay-vs-live-t0.7 $PY benchmarks/replay_vs_live.py --traces data/traces/$PAIR-test-t0.7.npz --per-language 8 --repeats 4 \
    --out benchmarks/results/replay_vs_live_t0.7
  # a tree profile of the same hour: replay's modelled time against live is only as good as the profile's moment
  step tree-replay-profile $A profile --pair $PAIR --dtype "$DTYPE" --tree-mask --max-verify 64 \
    --out benchmarks/results/tree_replay_vs_live-profile.json
  step tree-replay-vs-live $PY benchmarks/tree_replay_vs_live.py --per-language 2 --policy $KEEP/tree \
    --profile benchmarks/results/tree_replay_vs_live-profile.json
  step greedy-identity $PY benchmarks/greedy_identity.py --dtype float32 --new-tokens 48 --policy static:4 --tree 4,4,8
}

load() {
  # into benchmarks/results/loadtests/NAME (committed), where a killed load test resumes at its first unfinished load
  step static $A loadtest --pair $PAIR --dtype "$DTYPE" --policy static:1 --policy static:2 --policy static:3 --policy static:4 \
    --policy costmodel --policy goodput --batch-profile profiles/$PAIR-batch.json --concurrency 1,2,4,8 --requests 16 --out benchmarks/results/loadtests/static
  # the learned policy, uncapped, capped at the per-batch-size schedule that train-batch found in replay (both
  # printed in its log) and trained inside that schedule, against the schedule, in the same run
  local trained=$LOG/policies-batch.log
  local schedule="schedule:(as printed in $trained)" capped="capped:(as printed in $trained)"
  if [[ -z "${DRY_RUN:-}" ]]; then
    schedule=$(grep -o 'schedule:[^ ]*' "$trained" 2>/dev/null | tail -1) || { echo "load-learned needs $trained: run the policies stage first"; exit 1; }
    capped=$(grep -o 'capped:[^ ]*' "$trained" | tail -1) || { echo "$trained names no capped policy: rerun the policies stage"; exit 1; }
    capped=${capped%:*}:$KEEP/batch-rounds  # the spec names the policy's runs/ folder; the same policy is kept here
  fi
  step learned $A loadtest --pair $PAIR --dtype "$DTYPE" --policy $KEEP/batch-rounds --policy "$capped" --policy $KEEP/batch-rounds-cap --policy "$schedule" \
    --concurrency 1,2,4,8 --requests 16 --repeats 2 --out benchmarks/results/loadtests/learned
  # the per-step policy against the schedule, six repeats (pool_loadtests.py sets them against each other run by run)
  step learned-step $A loadtest --pair $PAIR --dtype "$DTYPE" --policy $KEEP/batch-step --policy "$schedule" \
    --concurrency 1,2,4,8 --requests 16 --repeats 6 --out benchmarks/results/loadtests/learned-step
}

fp32() {
  # the load-aware policies where every policy decodes the very same text: at float32 greedy batched decoding is
  # token-identical to plain decoding, so live ratios between two policies hold no near-tie flips (at bf16 about half
  # the requests decode other text under another policy). Its own profile, policies and schedule, all at float32.
  step profile $A profile --pair $PAIR --dtype float32 --batches 1,2,4,8 --max-verify 7 --repetitions 10 --out profiles/$PAIR-fp32-batch.json
  step batch-rounds --creates $KEEP/batch-rounds-fp32/policy.json train_batch_kept batch-rounds-fp32 --batch-profile profiles/$PAIR-fp32-batch.json
  step batch-step --creates $KEEP/batch-step-fp32/policy.json train_batch_kept batch-step-fp32 --batch-profile profiles/$PAIR-fp32-batch.json \
    --per-step --cap-at-schedule --timesteps 1200000
  local trained=$LOG/fp32-batch-rounds.log schedule="schedule:(as printed in $LOG/fp32-batch-rounds.log)"
  if [[ -z "${DRY_RUN:-}" ]]; then
    schedule=$(grep -o 'schedule:[^ ]*' "$trained" | tail -1) || { echo "$trained names no schedule: rerun fp32-batch-rounds"; exit 1; }
  fi
  step load $A loadtest --pair $PAIR --dtype float32 --policy $KEEP/batch-step-fp32 --policy $KEEP/batch-rounds-fp32 --policy "$schedule" \
    --concurrency 1,2,4,8 --requests 16 --repeats 4 --out benchmarks/results/loadtests/fp32
  # the same policies taking rounds in turn (--interleave: host drift reaches all alike), with the schedule twice (the
  # second capped at itself: the same depths, an A/A control of what the interleaved measurement can tell apart)
  step load-interleaved $A loadtest --pair $PAIR --dtype float32 --policy $KEEP/batch-rounds-fp32 --policy $KEEP/batch-step-fp32 \
    --policy "$schedule" --policy "capped:${schedule#schedule:}:$schedule" --interleave \
    --concurrency 1,2,4,8 --requests 16 --repeats 3 --out benchmarks/results/loadtests/fp32-interleaved
}

retarget() {
  step profile-1thread $A profile --pair $PAIR --dtype "$DTYPE" --threads 1 --max-verify 16 --out profiles/$PAIR-1thread.json
  step derive-flat-verify $PY scripts/what_if_profile.py --source profiles/$PAIR.json --verify-slope 0.1 --out profiles/what-if-flat-verify.json
  step derive-cheap-draft $PY scripts/what_if_profile.py --source profiles/$PAIR.json --verify-slope 0.1 --draft-scale 0.3 \
    --out profiles/what-if-flat-verify-cheap-draft.json
  step derive-slow-draft $PY scripts/what_if_profile.py --source profiles/$PAIR.json --verify-slope 1 --draft-scale 3 --out profiles/what-if-slow-draft.json
  local profile
  for profile in $PAIR-1thread $PAIR-xeon what-if-flat-verify what-if-flat-verify-cheap-draft what-if-slow-draft; do
    step "$profile" $A retarget runs/quickstart-latest --profile profiles/$profile.json --timesteps 10000
  done
}

chosen=("$@")
[[ ${#chosen[@]} -eq 0 ]] && chosen=("${STAGES[@]}")
for STAGE in "${chosen[@]}"; do
  [[ " ${STAGES[*]} " == *" $STAGE "* ]] || { echo "unknown stage '$STAGE'; stages: ${STAGES[*]}"; exit 2; }
done
for STAGE in "${chosen[@]}"; do
  echo "== $STAGE"
  [[ " policies evaluations speedup load benchmarks " == *" $STAGE "* ]] && on_profiled_machine
  "$STAGE"
done
[[ -n "${DRY_RUN:-}" ]] && { echo "remeasure: dry run, nothing ran"; exit 0; }
echo "remeasure: every step done; copy the numbers from $LOG and benchmarks/results into the README"
