"""The rules of the matrix: which runs this machine can run, how a global batch splits over a
run's GPUs (or CPU processes), and the launches torch itself would refuse. compare.py refuses a
matrix some run would break, before any run starts, in one line, rather than start an hour of runs
and meet the refusal in the middle (each train.py refuses the same mistakes for itself, as it
starts; its flags are checked by its own parser: comparison/train_files.py)."""
from __future__ import annotations

# torch.compile's modes that capture CUDA graphs: reduce-overhead, and max-autotune (inductor's
# triton.cudagraphs is on in both; torch._inductor.list_mode_options)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# The first gradient bucket of a DDP model compiled by TorchDynamo: DDPOptimizer
# (torch/_dynamo/backends/distributed.py) asserts "First bucket should be smaller/equal to other
# buckets" when --bucket_cap_mb is below torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES.
FIRST_BUCKET_BYTES = 1024 * 1024


def machine_refusal(cuda: bool, backends=(), sync_bn: bool = False, memory_snapshot: int = 0,
                    flag: str = "--backends") -> str | None:
    """Why this machine (`cuda`: it has CUDA GPUs) cannot run any of `backends`, SyncBatchNorm or
    a --memory_snapshot; None when it can. `flag` names the backends as the user gave them."""
    if "nccl" in backends and not cuda:
        return f"{flag} nccl needs CUDA GPUs and this machine has none: use {flag} gloo on CPUs"
    if sync_bn and not cuda:
        return ("SyncBatchNorm (--sync_bn on) needs GPUs: PyTorch's SyncBatchNorm refuses CPU "
                "modules")
    if memory_snapshot and not cuda:
        return (f"--memory_snapshot {memory_snapshot} records the CUDA caching allocator's "
                "history, and this machine has no CUDA GPU: leave it out, or run on a GPU")
    return None


def launch_refusal(mode: str, processes: int, args, cuda: bool) -> str | None:
    """Why `mode` over `processes` (GPUs; CPU processes without them) cannot run the flags `args`
    (the run's argv as its train.py's parser read it) here; None when it can. An evaluation trains
    nothing: any batch suits any number of processes."""
    sync_bn = getattr(args, "sync_bn", False)
    refusal = machine_refusal(cuda, (getattr(args, "backend", None),), sync_bn,
                              args.memory_snapshot, flag="--backend")
    if refusal is not None:
        return refusal
    devices = processes if cuda or mode != "data_parallel" else 1  # DataParallel on the CPU: one
    if mode == "data_parallel" and args.compile and devices > 1:
        return (f"--compile with data_parallel on {devices} GPUs would compile nothing "
                "(TorchDynamo does not trace DataParallel's replica threads): leave out --compile, "
                "or use dist_parallel")
    if args.compile and mode == "fsdp" and args.compile_mode in CUDA_GRAPH_MODES:
        return (f"--compile_mode {args.compile_mode} captures CUDA graphs, which FSDP2 cannot keep "
                "(its unsharded parameters are allocated anew every step; pytorch/pytorch#127225): "
                "give --compile_mode default or max-autotune-no-cudagraphs")
    bucket = getattr(args, "bucket_cap_mb", None)
    if args.compile and mode == "dist_parallel" and int(bucket * 2**20) < FIRST_BUCKET_BYTES:
        return (f"--bucket_cap_mb {bucket:g} with --compile: compiled DDP needs buckets at least "
                f"as large as its first one (1 MiB; torch's DDPOptimizer asserts otherwise): give "
                "--bucket_cap_mb 1 or more")
    if mode == "pipeline_parallel":
        return pipeline_refusal(processes, args)
    if mode != "single_gpu" and args.batch_size % devices and not args.evaluate:
        unit = "GPUs" if mode == "data_parallel" else "processes"
        return (f"--batch_size {args.batch_size} does not divide over {devices} {unit}: the global "
                f"batch is split evenly, so give a multiple of {devices}")
    return None


def pipeline_refusal(processes: int, args) -> str | None:
    """Why pipeline_parallel cannot cut this model into `processes` stages, or split this batch
    into its micro-batches (its own refusals, as it would meet them once its workers started);
    None when it can. It cuts PyramidNet, or an nn.Sequential put in its get_model: no
    torchvision classifier is one."""
    if args.model != "pyramidnet":
        return (f"pipeline_parallel cuts PyramidNet into stages (or your nn.Sequential, in its "
                f"get_model); --model {args.model} is no sequence of pieces: leave "
                "pipeline_parallel out of --modes")
    if processes < 2:
        return "pipeline_parallel on 1 process has nothing to pipeline: give 2 or more"
    from comparison.model_shapes import pipeline_piece_count

    pieces = pipeline_piece_count(vars(args))
    if pieces is not None and pieces < processes:
        return (f"the model has {pieces} pieces to cut into {processes} pipeline stages: give "
                f"--gpu_counts of {pieces} or fewer, or a deeper model")
    microbatches = args.microbatches
    if microbatches and not args.evaluate and args.batch_size % microbatches:
        return (f"--batch_size {args.batch_size} does not split into {microbatches} "
                f"micro-batches: give a multiple of {microbatches}")
    if microbatches and microbatches < processes:
        return (f"--microbatches {microbatches}: {processes} stages need at least {processes} a "
                "step, one for each to work on")
    return None
