#!/usr/bin/env bash
# Slurm, tested against a real one (issue 24). The test starts a one-node Slurm cluster on this
# machine (munged, slurmctld and slurmd with their own key, slurm.conf, ports and state in a scratch
# directory; all stopped and removed on exit, also on failure), then trains the CPU trainer on 2 ranks
# (24 steps of a 2-layer model, ZeRO-1, a checkpoint every 4 steps) and checks:
#   - the example batch script, scripts/multi_node/slurm.sbatch, adapted only through what it
#     documents (TRAINER, sbatch's options, trainer flags after the script), completes, and its
#     model.bin and every step's loss and gradient norm are bitwise those of mpirun -np 2;
#   - srun --mpi=pmix -n 2 ./train_gpt_cpu trains as 2 ranks, bitwise as mpirun -np 2 with the same flags;
#     a rank killed (LLMC_FAULTS=kill@6:1) ends the whole step even with --kill-on-bad-exit=0: srun exits 137;
#   - a rank of the batch script's step SIGKILLed after step 10: scripts/supervise.sh inside the
#     allocation relaunches the step with -y 1, and the job finishes bitwise the uninterrupted run;
#   - the batch job requeued after step 10 (sbatch --requeue, scontrol requeue): Slurm runs the script
#     again under the same job id, it resumes from its output directory (-y 1), its log keeps both
#     runs, and it finishes bitwise the uninterrupted run.
# Without Slurm or munge installed, or not as root (slurmd runs the jobs, as root), it prints one line
# saying why and exits 0.
#   test/slurm/run_slurm_tests.sh ./train_gpt_cpu    (from the repository root)
set -euo pipefail

trainer=${1:-./train_gpt_cpu}
for cmd in slurmctld slurmd sbatch munged; do
    if ! command -v "$cmd" >/dev/null; then
        echo "slurm: skipped, $cmd not installed (apt-get install slurmctld slurmd slurm-client munge)"
        exit 0
    fi
done
if [ "$(id -u)" != 0 ]; then echo "slurm: skipped, not root (the test cluster's slurmd runs jobs as root)"; exit 0; fi
[ -x "$trainer" ] || { echo "run_slurm_tests.sh: $trainer is not built" >&2; exit 1; }
train_glob='data/default/default_train_*.bin'
compgen -G "$train_glob" >/dev/null || { echo "run_slurm_tests.sh: no $train_glob (make data)" >&2; exit 1; }
sbatch_script=scripts/multi_node/slurm.sbatch
[ -f "$sbatch_script" ] || { echo "run_slurm_tests.sh: run it from the repository root" >&2; exit 1; }

# mpirun (Open MPI's root consent, --oversubscribe), OMP_NUM_THREADS=1, $dir, curve (step loss norm)
# shellcheck source=test/mpi/lib.sh
source test/mpi/lib.sh
unset LLMC_FAULTS

# run_ckpt_tests.sh's configuration at ZeRO-1, the batch script's stage: 24 steps, a checkpoint every 4.
common=(-i "$train_glob" -j "" --tokenizer "" -e d4 --num-layers 2 --channels 64 --num-heads 2 --max-seq-len 64
        -b 2 -t 32 -d 768 -x 24 -l 3e-3 -u 4 -v 0 -s 0 -n 4 -z 1)

fail() { echo "FAILED: $*" >&2; exit 1; }
# same_bits REF OUT WHAT: every step's logged loss and gradient norm and the final model.bin of OUT are
# REF's, bit for bit (the first steps that differ are shown)
same_bits() {
    local expected actual
    expected=$(curve "$1/metrics.jsonl")
    actual=$(curve "$2/metrics.jsonl")
    if [ "$actual" != "$expected" ]; then
        paste -d ' ' <(echo "$expected") <(echo "$actual") |
            awk '($2 != $5 || $3 != $6) && shown++ < 5 { print "step " $1 ": loss " $2 " norm " $3 ", against " $5 " " $6 }' >&2
        fail "$3: the logged losses differ from $1's"
    fi
    [ "$(echo "$actual" | wc -l)" = 24 ] || fail "$3: expected 24 steps in metrics.jsonl"
    cmp -s "$1/model.bin" "$2/model.bin" || fail "$3: model.bin differs from $1's"
}

# ---- the cluster: one node (llmc0, 2 CPUs) on 127.0.0.1, everything under $dir/cluster ----
cluster="$dir/cluster"
node=llmc0
ctld_pid="" slurmd_pid="" munged_pid=""

free_port() {  # a random port in 20000-59999 that nothing on 127.0.0.1 listens on
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
    done
}
wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
    local seconds=$1 what=$2 waited=0
    shift 2
    until "$@" >/dev/null 2>&1; do
        sleep 0.2
        waited=$((waited + 1))
        [ $waited -lt $((seconds * 5)) ] || fail "$what: not within $seconds s"
    done
}
node_idle() { [ "$(sinfo -h -n "$node" -o %T)" = idle ]; }

start_cluster() {
    mkdir -p "$cluster/munge" "$cluster/state" "$cluster/spool" "$cluster/tmp"
    # munged runs as its own user, which must reach its key and socket: the directories on the way are
    # traversable, its own directory is its alone.
    chmod 711 "$dir" "$cluster"
    dd if=/dev/urandom of="$cluster/munge/munge.key" bs=1024 count=1 status=none
    chown -R munge:munge "$cluster/munge"
    chmod 600 "$cluster/munge/munge.key"
    chmod 711 "$cluster/munge"
    setpriv --reuid=munge --regid=munge --init-groups munged --foreground --key-file="$cluster/munge/munge.key" \
        --socket="$cluster/munge/socket" --pid-file="$cluster/munge/munged.pid" --seed-file="$cluster/munge/seed" \
        --log-file="$cluster/munge/munged.log" >"$cluster/munged.out" 2>&1 &
    munged_pid=$!
    wait_for 10 "munged's socket" test -S "$cluster/munge/socket"

    # SlurmUser and SlurmdUser root: the jobs run as root. proctrack/linuxproc and task/none need no
    # cgroups; config_overrides lets the node have 2 CPUs whatever this machine has. cred_expire=5 and
    # sched_interval=1: a requeued job waits 6 s before it may start again (not 121) and is scheduled
    # within a second (not 60).
    export SLURM_CONF="$cluster/slurm.conf"
    cat >"$SLURM_CONF" <<EOF
ClusterName=llmctest
SlurmctldHost=$(uname -n | cut -d. -f1)(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$cluster/munge/socket,cred_expire=5
StateSaveLocation=$cluster/state
SlurmdSpoolDir=$cluster/spool
TmpFS=$cluster/tmp
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    slurmctld -D >"$cluster/slurmctld.log" 2>&1 &
    ctld_pid=$!
    slurmd -D -N "$node" >"$cluster/slurmd.log" 2>&1 &
    slurmd_pid=$!
    wait_for 30 "node $node idle (the cluster up)" node_idle
    echo "ok a one-node cluster is up: $(sinfo -h -o '%P %a %D %T %N %c CPUs') (Slurm $(sinfo -V | cut -d' ' -f2))"
}

# Cancels every job, waits for their processes to end, then stops the daemons. Runs on exit.
stop_cluster() {
    local pid waited=0
    if [ -n "$ctld_pid" ]; then
        scancel --quiet --user=root 2>/dev/null
        while [ -n "$(squeue -h 2>/dev/null)" ] && [ $waited -lt 150 ]; do sleep 0.2; waited=$((waited + 1)); done
        # a job's processes that outlived it (none expected): ended by their id
        for pid in $(scontrol listpids "*" "$node" 2>/dev/null | awk 'NR > 1 { print $1 }'); do kill -9 "$pid" 2>/dev/null; done
    fi
    for pid in $slurmd_pid $ctld_pid $munged_pid; do kill "$pid" 2>/dev/null; done
    for pid in $slurmd_pid $ctld_pid $munged_pid; do wait "$pid" 2>/dev/null; done
}
on_exit() {
    local rc=$?
    set +e
    if [ $rc != 0 ] && [ -d "$cluster" ]; then
        for f in slurmctld.log slurmd.log munged.out; do
            [ -s "$cluster/$f" ] && { echo "--- the last lines of $f:"; tail -n 15 "$cluster/$f"; } >&2
        done
    fi
    stop_cluster
    rm -rf "$dir"
    exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# ---- jobs ----
# submit OUT [sbatch options...]: the batch script, training into OUT (its log OUT.log); sets $job.
submit() {
    local out=$1
    shift
    job=$(TRAINER=$trainer sbatch --parsable --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 \
          --output="$out.log" "$@" "$sbatch_script" "${common[@]}" -o "$out")
}
job_field() { scontrol -o show job "$job" | grep -o " $1=[^ ]*" | cut -d= -f2; }
# finished OUT: waits for $job to end (at most 3 minutes); fails unless it COMPLETED with exit code 0
finished() {
    local state waited=0
    while :; do
        state=$(job_field JobState)
        case "$state" in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) break ;;
        esac
        sleep 0.2
        waited=$((waited + 1))
        [ $waited -lt 900 ] || { cat "$1.log" >&2; fail "job $job still $state after 3 minutes"; }
    done
    [ "$state" = COMPLETED ] && [ "$(job_field ExitCode)" = 0:0 ] ||
        { cat "$1.log" >&2; fail "job $job ended $state with exit code $(job_field ExitCode)"; }
}
# after_step OUT STEP: waits until OUT's metrics.jsonl has STEP, the job still running
after_step() {
    local state waited=0
    until grep -q "\"step\":$2,.*train_loss" "$1/metrics.jsonl" 2>/dev/null; do
        state=$(job_field JobState)
        [ "$state" = RUNNING ] || [ "$state" = PENDING ] || { cat "$1.log" >&2; fail "job $job ended ($state) before step $2"; }
        sleep 0.05
        waited=$((waited + 1))
        [ $waited -lt 2400 ] || fail "step $2 never came"
    done
}

start_cluster

echo "== the reference: mpirun -np 2"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -o "$dir/ref" >"$dir/ref.log" 2>&1 || { cat "$dir/ref.log"; fail "mpirun reference run"; }

echo "== sbatch $sbatch_script: completes, bitwise the mpirun run"
out="$dir/sbatch"
submit "$out"
finished "$out"
grep -q "batch: .* x 2 data-parallel rank(s) x 6 accumulation" "$out.log" || { cat "$out.log"; fail "the batch job did not train on 2 ranks"; }
same_bits "$dir/ref" "$out" "sbatch"
echo "ok job $job: $(grep -o 'attempt 1: the run finished' "$out.log"), bitwise equal ($(grep -m1 -o 'srun --mpi=pmix [^ ]* [^ ]*' "$out.log"))"

echo "== srun --mpi=pmix -n 2: bitwise the mpirun run with the same flags"
out="$dir/srun"
timeout 300 srun --mpi=pmix -n 2 "$trainer" "${common[@]}" -o "$out" >"$out.log" 2>&1 || { cat "$out.log"; fail "srun exited non-zero"; }
grep -q "batch: .* x 2 data-parallel rank(s) x 6 accumulation" "$out.log" || { cat "$out.log"; fail "srun did not start 2 ranks of one job"; }
same_bits "$dir/ref" "$out" "srun"
echo "ok srun: 2 ranks, bitwise equal"

echo "== srun --kill-on-bad-exit=0: a rank's death still ends the whole step, srun exits 137"
out="$dir/srun_kill"
rc=0
LLMC_FAULTS=kill@6:1 timeout 300 srun --kill-on-bad-exit=0 --mpi=pmix -n 2 "$trainer" "${common[@]}" -o "$out" \
    >"$out.log" 2>&1 || rc=$?
[ $rc = 137 ] && grep -q "task 1: Killed" "$out.log" && grep -q "STEP .* CANCELLED" "$out.log" && grep -q "task 0: Killed" "$out.log" ||
    { cat "$out.log"; fail "rank 1 killed at step 6: expected srun to end the step with exit code 137, got $rc"; }
echo "ok rank 1 killed at step 6: $(grep -o 'STEP .* CANCELLED' "$out.log" | sed 's/ AT .*//'), rank 0 killed too, srun exit $rc"

echo "== a rank killed mid-run: supervise.sh inside the allocation relaunches the step, bitwise the uninterrupted run"
out="$dir/kill"
submit "$out"
after_step "$out" 10
rank1=$(scontrol listpids "$job.0" "$node" | awk '$3 == 0 && $5 == 1 { print $1 }')
[ -n "$rank1" ] || fail "no rank 1 in step $job.0 ($(scontrol listpids "$job.0" "$node"))"
kill -9 "$rank1"
finished "$out"
grep -q "supervise: attempt 1 failed: exit code 137, killed by signal 9" "$out.log" || { cat "$out.log"; fail "the kill was not the first attempt's end"; }
grep -q "supervise: recovered: resumed from step [0-9]*" "$out.log" || { cat "$out.log"; fail "the relaunched step did not resume"; }
same_bits "$dir/ref" "$out" "kill and supervise.sh"
echo "ok job $job: rank 1 (pid $rank1) killed after step 10, $(grep -o 'recovered: resumed from step [0-9]*' "$out.log"); bitwise equal"

echo "== the job requeued mid-run (sbatch --requeue, scontrol requeue): resumed by -y 1, bitwise the uninterrupted run"
out="$dir/requeue"
submit "$out" --requeue
after_step "$out" 10
scontrol requeue "$job"
finished "$out"
[ "$(job_field Restarts)" = 1 ] || fail "job $job: expected Restarts=1, got $(job_field Restarts)"
grep -q "resume: no complete checkpoint in '$out'; starting fresh" "$out.log" && grep -q "resumed from $out/ckpt_000000[0-9][0-9]" "$out.log" ||
    { cat "$out.log"; fail "the requeued job's log (--open-mode=append) does not have a fresh start, then a resume"; }
same_bits "$dir/ref" "$out" "requeue"
echo "ok job $job: requeued after step 10, run again (Restarts=1), $(grep -o 'resumed from [^:]*' "$out.log" | sed "s|$dir/||"); bitwise equal"
