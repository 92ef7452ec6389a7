"""kubernetes/*.yaml as Kubeflow's operators run them, on the CPU: the manifests checked against
the operators' own API models, and the scripts started in the environment each operator gives its
pods, two processes over gloo on this host.

The environments are what the operators' sources set, re-stated here (tests/test_kubernetes.py
is their only copy, and says where each comes from):
- PyTorchJob (kubeflow/training-operator v1, pkg/controller.v1/pytorch: envvar.go, master.go,
  elastic.go; the defaults of pkg/apis/kubeflow.org/v1/pytorch_defaults.go): with a Master,
  MASTER_ADDR/PORT and PET_MASTER_ADDR/PORT (pod <job>-master-0, its pytorchjob-port), RANK (the
  Master 0, Worker i i + 1), PET_NODE_RANK the same, WORLD_SIZE (pods x nprocPerNode, 1 when
  "auto"), and never LOCAL_RANK; PET_NPROC_PER_NODE (nprocPerNode, "auto" by default); PET_NNODES
  (the pods); with an elasticPolicy, PET_RDZV_ENDPOINT (pod <job>-worker-0 and its port),
  PET_RDZV_BACKEND, PET_NNODES as MIN:MAX, PET_MAX_RESTARTS; PYTHONUNBUFFERED=1 in every pod.
- TrainJob (kubeflow/trainer, pkg/runtime/framework/plugins/torch/torch.go): PET_NNODES,
  PET_NPROC_PER_NODE (numProcPerNode, else "auto"), PET_NODE_RANK (the Job's completion index),
  PET_MASTER_ADDR (<job>-node-0-0.<job>), PET_MASTER_PORT (29500), in the container named node;
  the trainer's env beside them, which may not name those five.
Every pod's name resolves to this host (127.0.0.1) and the operator's port is a free one; the
container's command and args are the manifest's, $(VAR) expanded from its env as the kubelet
does, with /workspace (the image's repository) and /mnt/shared (the shared volume) mapped to this
checkout and a scratch folder, and the tests' tiny run's flags appended (argparse keeps the last
value of a flag). Each manifest is adapted as its header says: the pods, GPUs per pod, MODE.

What this cannot show: a real cluster (the operators' controllers and webhooks, the kubelet,
DNS between pods, the shared volume, GPUs and the device plugin, restarts and evictions), which
the manifests' headers describe from the operators' sources.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import runkit
from conftest import REPO, TINY, free_port, read_results, train_file

MANIFESTS = REPO / "kubernetes"
TRAIN_ARGS = [*TINY, "--backend", "gloo"]
# what torchrun's name and python's stand for in the image: this interpreter
COMMANDS = {"torchrun": [sys.executable, "-m", "torch.distributed.run"], "python": [sys.executable]}
# the reserved names of Trainer's torch plugin (pkg/constants: TorchRunReservedEnvNames)
TRAINJOB_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                     "PET_MASTER_PORT"}


def load(name: str) -> list[dict]:
    return list(yaml.safe_load_all((MANIFESTS / name).read_text()))


# ------------------------------------------------------------------------- 1. the operators' models
def pytorchjob_round_trip(manifest: dict) -> dict:
    """The PyTorchJob read into the training operator's SDK models (kubeflow-training, on the
    kubernetes client's models for the pod template) and written back: a field they do not know
    is dropped, a value of the wrong type changed, a required one missing refused."""
    from kubeflow.training import ApiClient

    client = ApiClient()
    job = client._ApiClient__deserialize(manifest, "KubeflowOrgV1PyTorchJob")
    return client.sanitize_for_serialization(job)


def trainer_round_trip(manifest: dict) -> dict:
    """A TrainJob or TrainingRuntime read into Kubeflow Trainer's API models
    (kubeflow-trainer-api, pydantic, strict types) and written back."""
    from kubeflow_trainer_api import models

    kinds = {"TrainJob": models.TrainerV1alpha1TrainJob,
             "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime}
    return kinds[manifest["kind"]].from_dict(manifest).to_dict()


@pytest.mark.parametrize("name", ["pytorchjob.yaml", "pytorchjob-pod-per-gpu.yaml"])
def test_the_pytorchjobs_are_what_the_operators_models_read(name):
    manifest, = load(name)
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "PyTorchJob"
    assert pytorchjob_round_trip(manifest) == manifest
    for spec in manifest["spec"]["pytorchReplicaSpecs"].values():
        container, = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"  # the operator sets its variables in this one
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")


def test_the_trainjob_and_its_runtime_are_what_the_trainers_models_read():
    runtime, job = load("trainjob.yaml")
    assert (runtime["kind"], job["kind"]) == ("TrainingRuntime", "TrainJob")
    assert trainer_round_trip(runtime) == runtime and trainer_round_trip(job) == job
    assert job["spec"]["runtimeRef"] == {"name": runtime["metadata"]["name"],
                                         "kind": "TrainingRuntime"}
    assert not {env["name"] for env in job["spec"]["trainer"]["env"]} & TRAINJOB_RESERVED
    node, = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"  # PET_MASTER_ADDR is <job>-node-0-0.<job>
    container, = node["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "node"  # the torch plugin sets PET_* in this one
    assert node["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}


@pytest.mark.parametrize("mistake", ["unknown field", "wrong type"])
def test_the_models_refuse_what_a_cluster_would(mistake):
    """The checks above can fail: a misspelt field, a count given as text."""
    job, = load("pytorchjob.yaml")
    runtime, trainjob = load("trainjob.yaml")
    if mistake == "unknown field":
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 2
        assert pytorchjob_round_trip(job) != job
        trainjob["spec"]["trainer"]["numNode"] = 2
        assert trainer_round_trip(trainjob) != trainjob
    else:
        job["spec"]["nprocPerNode"] = 8  # the operator's field is a string ("auto" or a count)
        assert pytorchjob_round_trip(job) != job
        trainjob["spec"]["trainer"]["numProcPerNode"] = "8"
        with pytest.raises(ValueError, match="numProcPerNode|num_proc_per_node"):
            trainer_round_trip(trainjob)


# ---------------------------------------------------------------------- 2. the operators' variables
def pytorchjob_env(job: dict, replica_type: str, index: int) -> dict[str, str]:
    """What the training operator sets in pod `index` of `replica_type` (envvar.go's setPodEnv,
    after the defaults: nprocPerNode "auto", elastic min and max replicas from the workers)."""
    spec, name = job["spec"], job["metadata"]["name"]
    replicas = {kind: each.get("replicas", 1) for kind, each in spec["pytorchReplicaSpecs"].items()}
    nproc = spec.get("nprocPerNode", "auto")
    env = {"PYTHONUNBUFFERED": "1"}
    if "Master" in replicas:
        address, port = f"{name}-master-0", str(operator_port(job, "Master"))
        env.update(MASTER_PORT=port, PET_MASTER_PORT=port, MASTER_ADDR=address,
                   PET_MASTER_ADDR=address)
        rank = index + 1 if replica_type == "Worker" else index
        world_size = sum(replicas.values()) * (int(nproc) if nproc.isdigit() else 1)
        env.update(WORLD_SIZE=str(world_size), RANK=str(rank), PET_NODE_RANK=str(rank))
    env["PET_NPROC_PER_NODE"] = nproc
    elastic = spec.get("elasticPolicy")
    if elastic is None:
        env["PET_NNODES"] = str(sum(replicas.values()))
        return env
    host = elastic.get("rdzvHost", f"{name}-worker-0")
    env["PET_RDZV_ENDPOINT"] = f"{host}:{elastic.get('rdzvPort', operator_port(job, 'Worker'))}"
    env["PET_RDZV_BACKEND"] = elastic.get("rdzvBackend", "c10d")
    most = elastic.get("maxReplicas", elastic.get("minReplicas", replicas["Worker"]))
    env["PET_NNODES"] = f"{elastic.get('minReplicas', most)}:{most}"
    if "maxRestarts" in elastic:
        env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
    return env


def operator_port(job: dict, replica_type: str) -> int:
    """The container port named pytorchjob-port (23456 when the job names none)."""
    container = job["spec"]["pytorchReplicaSpecs"][replica_type]["template"]["spec"][
        "containers"][0]
    return next((port["containerPort"] for port in container.get("ports", [])
                 if port["name"] == "pytorchjob-port"), 23456)


def trainjob_env(job: dict, node: int) -> dict[str, str]:
    """What Trainer's torch plugin sets in the container of node `node` (EnforceMLPolicy)."""
    trainer, name = job["spec"]["trainer"], job["metadata"]["name"]
    return {"PET_NNODES": str(trainer.get("numNodes", 1)),
            "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
            "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
            "PET_MASTER_PORT": "29500"}


def on_this_host(env: dict[str, str], hosts: list[str], ports: dict[str, str]) -> dict[str, str]:
    """`env` with each pod's name resolving to this host and the operator's port a free one."""
    placed = {}
    for key, value in env.items():
        for host in hosts:
            value = value.replace(host, "127.0.0.1")
        placed[key] = ports.get(value, value) if key.endswith("PORT") else value
        if key == "PET_RDZV_ENDPOINT":
            address, _, port = placed[key].rpartition(":")
            placed[key] = f"{address}:{ports.get(port, port)}"
    return placed


def container_command(container: dict, env: dict[str, str], shared: Path) -> list[str]:
    """The container's command and args as the kubelet runs them ($(VAR) from its env), in this
    checkout, with the tests' tiny run appended."""
    def expand(arg: str) -> str:
        arg = re.sub(r"\$\((\w+)\)", lambda var: env.get(var[1], var[0]), arg)
        return arg.replace("/workspace", str(REPO)).replace("/mnt/shared", str(shared))

    command, *args = [*container["command"], *container.get("args", [])]
    return [*COMMANDS[command], *map(expand, args), *TRAIN_ARGS]


def container_env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def start_pods(pods: list[tuple[list[str], dict]], tmp_path: Path, timeout=150) -> list[str]:
    """Run each pod's command with its environment (over this process's, less what a launcher
    set), all at once, and return each one's output."""
    base = {key: value for key, value in os.environ.items()
            if not key.startswith(("PET_", "TORCHELASTIC_")) and key not in
            ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    base.update(OMP_NUM_THREADS="1")
    logs = [tmp_path / f"pod{index}.log" for index in range(len(pods))]
    running = []
    for (command, env), log in zip(pods, logs):
        with log.open("w") as out:
            running.append(subprocess.Popen(command, cwd=REPO, env={**base, **env}, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True))
    try:
        codes = [pod.wait(timeout=timeout) for pod in running]
    finally:
        for pod in running:
            if pod.poll() is None:
                os.killpg(pod.pid, 9)
                pod.wait()
    outputs = [log.read_text() for log in logs]
    assert codes == [0] * len(pods), "\n----\n".join(outputs)
    return outputs


def pytorchjob_pods(name: str, mode: str, tmp_path: Path) -> list[tuple[list[str], dict]]:
    """The manifest `name` as its header says to adapt it for two pods of one GPU (here a CPU
    process) each, in `mode`: each pod's command and environment."""
    job, = load(name)
    job = copy.deepcopy(job)
    specs = job["spec"]["pytorchReplicaSpecs"]
    if "Master" in specs:  # one process per pod
        specs["Worker"]["replicas"] = 1
        pods = [("Master", 0), ("Worker", 0)]
    else:  # torchrun in each pod, a worker per GPU
        job["spec"]["nprocPerNode"] = "1"
        job["spec"]["elasticPolicy"].update(minReplicas=2, maxReplicas=2)
        specs["Worker"]["replicas"] = 2
        pods = [("Worker", 0), ("Worker", 1)]
    name = job["metadata"]["name"]
    hosts = [f"{name}-master-0", f"{name}-worker-0"]
    ports = {str(operator_port(job, kind)): str(free_port()) for kind in specs}
    made = []
    for kind, index in pods:
        container, = specs[kind]["template"]["spec"]["containers"]
        env = {**container_env(container), "MODE": mode}
        env.update(on_this_host(pytorchjob_env(job, kind, index), hosts, ports))
        made.append((container_command(container, env, tmp_path / "shared"), env))
    assert all("LOCAL_RANK" not in env for _, env in made)  # the operator never sets it
    return made


def trainjob_pods(mode: str, tmp_path: Path) -> list[tuple[list[str], dict]]:
    """kubernetes/trainjob.yaml adapted for two nodes of one GPU (a CPU process) each."""
    runtime, job = load("trainjob.yaml")
    trainer = job["spec"]["trainer"]
    trainer.update(numNodes=2, numProcPerNode=1)
    container = {**trainer, "name": "node"}
    name = job["metadata"]["name"]
    ports = {"29500": str(free_port())}
    made = []
    for node in range(2):
        env = {**container_env(container), "MODE": mode}
        env.update(on_this_host(trainjob_env(job, node), [f"{name}-node-0-0.{name}"], ports))
        made.append((container_command(container, env, tmp_path / "shared"), env))
    return made


def trained(outputs: list[str], tmp_path: Path, run_name: str, mode: str) -> dict:
    results = read_results(tmp_path / "shared" / "runs" / run_name)
    assert results["mode"] == mode and results["world_size"] == 2, results
    assert sum(output.count("results in") for output in outputs) == 1  # rank 0 alone writes
    return results


def test_a_pytorchjob_of_one_process_per_pod_trains(tmp_path):
    """The plain PyTorchJob: `python train.py` in each pod, RANK and WORLD_SIZE from the operator
    and no LOCAL_RANK (the fast tier's launch; the others are second-tier)."""
    outputs = start_pods(pytorchjob_pods("pytorchjob-pod-per-gpu.yaml", "dist_parallel",
                                         tmp_path), tmp_path)
    trained(outputs, tmp_path, "pyramidnet-1gpu", "dist_parallel")


@pytest.mark.second_tier
def test_a_trainjob_trains(tmp_path):
    """The TrainJob: torchrun in each node's container, reading the torch plugin's PET_* (a
    static rendezvous at node 0). dist_parallel only: fsdp under this static rendezvous of two
    agents on one host aborted at exit on rank 1 ("terminate called without an active
    exception", inside torch, after the run had finished) in about one run of seven here, and the
    first agent then waits out its exit barrier; fsdp runs in both PyTorchJob forms below."""
    outputs = start_pods(trainjob_pods("dist_parallel", tmp_path), tmp_path)
    trained(outputs, tmp_path, "pyramidnet", "dist_parallel")


@pytest.mark.second_tier
@pytest.mark.parametrize("mode", ["dist_parallel", "fsdp"])
def test_an_elastic_pytorchjob_trains(tmp_path, mode):
    """The elastic PyTorchJob: torchrun in each pod, meeting over c10d at worker-0."""
    outputs = start_pods(pytorchjob_pods("pytorchjob.yaml", mode, tmp_path), tmp_path)
    trained(outputs, tmp_path, "pyramidnet", mode)


@pytest.mark.second_tier
def test_a_pytorchjob_of_one_process_per_pod_trains_fsdp(tmp_path):
    outputs = start_pods(pytorchjob_pods("pytorchjob-pod-per-gpu.yaml", "fsdp", tmp_path),
                         tmp_path)
    trained(outputs, tmp_path, "pyramidnet-1gpu", "fsdp")


# ------------------------------------------------------------------------- 3. each process's GPU
def placed_on(monkeypatch, mode: str, rank: int, local_rank: int | None, gpus: int) -> list:
    """The CUDA index `mode`'s setup() asks runkit.cuda_device for, as process `rank` of 16 with
    `local_rank` (None: unset, as in a PyTorchJob pod) on a node of `gpus` GPUs (the group itself
    not made)."""
    module, asked = train_file(mode), []
    monkeypatch.setattr(runkit, "cuda_device", lambda index: asked.append(index) or
                        torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(module.dist, "init_process_group", lambda *args, **kwargs: None)
    for key in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_RESTART_COUNT", "PYTORCH_MULTIGPU_SELF_LAUNCH"):
        monkeypatch.delenv(key, raising=False)
    env = {"RANK": rank, "WORLD_SIZE": 16, "MASTER_ADDR": "pytorchjob-master-0",
           "MASTER_PORT": 23456, **({} if local_rank is None else {"LOCAL_RANK": local_rank})}
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    with torch.backends.cudnn.flags(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "set_float32_matmul_precision", lambda precision: None)
        module.setup(module.get_args(["--backend", "gloo"]))
    return asked


@pytest.mark.parametrize("mode", ["dist_parallel", "fsdp"])
@pytest.mark.parametrize("rank, local_rank, gpus, expected", [
    (1, None, 1, 0),  # a PyTorchJob pod of one GPU: rank 1 takes its pod's GPU 0 (it was refused)
    (5, None, 1, 0),
    (3, None, 2, 1),  # pods of 2 GPUs, one process each: by rank
    (2, None, 4, 2),  # ranks started by hand on a node of 4 GPUs
    (6, None, 4, 2),  # ... and on the second such node
    (1, None, 0, 0),  # no GPU: the CPU
    (1, 1, 2, 1),  # torchrun's LOCAL_RANK, when it is there
    (0, 3, 4, 3),
    (9, 0, 1, 0),
])
def test_the_gpu_follows_local_rank_else_the_nodes_gpus(monkeypatch, mode, rank, local_rank,
                                                        gpus, expected):
    assert placed_on(monkeypatch, mode, rank, local_rank, gpus) == [expected]


@pytest.mark.parametrize("mode", ["dist_parallel", "fsdp"])
@pytest.mark.parametrize("local_rank, gpus", [(1, 1), (4, 4)])
def test_a_local_rank_past_the_nodes_gpus_is_refused_by_that_rank(monkeypatch, mode, local_rank,
                                                                  gpus):
    with pytest.raises(runkit.UsageError, match=f"^LOCAL_RANK={local_rank} has no GPU of its own "
                                                rf"\({gpus} on this node\)") as refused:
        placed_on(monkeypatch, mode, 0, local_rank, gpus)
    assert refused.value.rank_specific  # said by each rank that meets it, not by local rank 0


GROUP_FREED = """
import gc, importlib.util, sys, weakref
spec = importlib.util.spec_from_file_location("train", sys.argv[1] + "/dist_parallel/train.py")
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
import torch.distributed as dist
train.setup(train.get_args(["--backend", "gloo"]))
import torchvision
group = weakref.ref(dist.group.WORLD)
dist.destroy_process_group()
gc.collect()
print("freed" if group() is None else "alive")
"""


def test_destroy_process_group_frees_the_group_before_python_exits():
    """A pod's rank 1 that trained to its end exited -6 ("terminate called without an active
    exception", torch 2.14.1), and Kubernetes restarts a pod that fails: torch.distributed.nn,
    imported by torchvision after init_process_group, took the group as its functions' default
    argument and kept it, and its gloo threads, alive into Python's exit: destroy_process_group
    must free the group."""
    rank0_of_one = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", GROUP_FREED, str(REPO)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **rank0_of_one})
    assert done.stdout.split()[-1:] == ["freed"], done.stdout + done.stderr


# ---------------------------------------------------------- 4. the self-launch inside such a pod
def self_launch(tmp_path: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """`python dist_parallel/train.py --nproc_per_node 2` (no torchrun) in a pod's environment."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("PET_")}
    return subprocess.run(
        [sys.executable, str(REPO / "dist_parallel" / "train.py"), "--nproc_per_node", "2",
         *TRAIN_ARGS, "--log_dir", str(tmp_path / "runs"), "--run_name", "pod"],
        env={**base, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True,
        timeout=timeout)


@pytest.mark.second_tier
def test_the_self_launch_in_a_pod_of_one_node_trains_as_its_flags_say(tmp_path):
    """An elastic PyTorchJob pod of one node (PET_STANDALONE="", as the operator writes it, which
    torchrun's parser could not even read, and a rendezvous elsewhere): the self-launch takes none
    of it and trains its 2 workers on this host."""
    env = {"PET_NNODES": "1:1", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "0",
           "PET_RDZV_ENDPOINT": "pyramidnet-worker-0.invalid:23456", "PET_RDZV_BACKEND": "c10d",
           "PET_MAX_RESTARTS": "3", "PET_STANDALONE": ""}
    done = self_launch(tmp_path, env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert read_results(tmp_path / "runs" / "pod")["world_size"] == 2
