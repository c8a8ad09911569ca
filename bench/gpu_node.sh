#!/usr/bin/env bash
# A real GPU node end to end, on the machine it runs on; prints one JSON line (last line of stdout).
#
#   bench/gpu_node.sh                      on a GPU machine: the agent finds its GPUs (no --gpus)
#   bench/gpu_node.sh --virtual-gpus 2     anywhere: the same run on made-up GPUs (checks the script
#                                          itself; cuda_ok is false and metrics_samples 0 there)
#
# It starts, on SQLite and the embedded broker (no service), a control worker, beat and one node agent,
# then bench/gpu_node.py submits a job that drives CUDA through ctypes on libcuda inside the sandbox
# (cuInit, cuDeviceGetCount, cuMemAlloc, then ~10 s of memsets so the agent has something to sample)
# and, on a machine with two GPUs or more, a second job on another GPU that must not see the first.
# Fields: gpus_discovered, model, job_device_count, cuda_ok, metrics_samples, foreign_gpu_visible
# (null on a one-GPU machine), memory_limit_held (a job declaring 1 GB that takes 1.5 GB ended out_of_memory;
# null where the node enforces no memory limit), sandbox (the mode the agent ran jobs in), limits (what its
# node enforces). Under 5 minutes.
#
# On a machine without network: carry wheels built for its Python (PYTHON=… names the interpreter whose
# site-packages hold them) and bubblewrap unpacked from its Debian package (E31_BWRAP_DIR=…/usr/bin).
# NVIDIA's driver may live under /usr/local/nvidia rather than in the loader's cache: both are searched.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3)
STATE=$(mktemp -d /var/tmp/e31-gpu-node.XXXXXX)
chmod 711 "$STATE"  # job uids pass through it to their own folders
mkdir -p "$STATE/datasets" "$STATE/outputs"
export DATABASE_URL="sqlite:///$STATE/e31.sqlite3" CELERY_BROKER_URL="filesystem://" E31_STATE_DIR="$STATE"
export E31_DATA_ROOTS="$STATE/datasets" E31_OUTPUT_ROOTS="$STATE/outputs"
export E31_HEARTBEAT_S=1 E31_NODE_TIMEOUT_S=30 E31_SCHEDULER_TICK_S=2 E31_GPU_SAMPLE_S=1 E31_GPU_RESCAN_S=30
export PYTHONUNBUFFERED=1
for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [[ -d $dir ]] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # NVML for the agent
done
[[ -d /usr/local/nvidia/bin ]] && export PATH="/usr/local/nvidia/bin:$PATH"       # nvidia-smi, the fallback
[[ -n ${E31_BWRAP_DIR:-} ]] && export PATH="$E31_BWRAP_DIR:$PATH"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ -n ${AGENT_GROUP:-} ]]; then  # whatever of a job outlived the agent goes with the group
    echo 1 >"$AGENT_GROUP/cgroup.kill" 2>/dev/null || true
    find "$AGENT_GROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true
  fi
  "$PY" -c "from jobs import attempt_space; attempt_space.release_all(__import__('pathlib').Path('$STATE'))" \
    2>/dev/null || true
  [[ -n ${E31_KEEP_STATE:-} ]] || rm -rf "$STATE"
}
trap cleanup EXIT

"$PY" manage.py migrate --verbosity 0
# One worker for the control, staging and notification queues (a deployment runs a worker for each).
"$PY" -m celery -A e31web worker -Q control,control.staging,control.notify --pool threads -c 4 -n bench-control@%h --without-gossip \
  --without-mingle --without-heartbeat --loglevel WARNING >"$STATE/worker.log" 2>&1 &
pids+=($!)
"$PY" -m celery -A e31web beat --schedule "$STATE/beat" --loglevel WARNING >"$STATE/beat.log" 2>&1 &
pids+=($!)
# A root agent on a cgroup v2 machine gets a group of its own, as a systemd unit with Delegate=yes gives it:
# v2 delegates no controller below a group that holds other processes (this script, the worker, beat).
AGENT_GROUP=""
if [[ $(id -u) == 0 ]] && grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  AGENT_GROUP=/sys/fs/cgroup/e31-bench-agent-$$
  mkdir "$AGENT_GROUP"
fi
(
  [[ -z $AGENT_GROUP ]] || echo "$BASHPID" >"$AGENT_GROUP/cgroup.procs"
  exec "$PY" manage.py node_agent --name bench-gpu "$@"
) >"$STATE/agent.log" 2>&1 &
pids+=($!)

if ! timeout 270 "$PY" bench/gpu_node.py --node bench-gpu; then
  echo "--- agent log" >&2
  tail -n 40 "$STATE/agent.log" >&2
  exit 1
fi
