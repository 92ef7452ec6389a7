"""torch.compile's side of a run, the same in every mode: where inductor's caches go, whether that
folder can be used (refused before a run starts: compile_cache_refusal) and whether it holds
compiled graphs, and the time a run spends compiling (and recording CUDA graphs), measured
by torch's own compile callbacks. In a process group, the ranks of a node that compile the same
graphs (CPU processes, or ranks sharing a GPU) can wait for its first rank to compile each graph,
then read it from the cache: one cold compile per node (common/guards.py, compile_leader, finds the
ranks; each process-group train.py makes the call).

What the clock measures (`compile_time_s` in results.json): the host's time inside
torch._dynamo's compile callbacks (torch/_dynamo/callback.py), which torch runs around each
frame TorchDynamo compiles (tracing, AOTAutograd and inductor: CallbackTrigger.DYNAMO), around
each backward graph compiled at its first backward (LAZY_BACKWARD) and around each CUDA graph
recorded under reduce-overhead and max-autotune (CUDAGRAPH_RECORDING, on a later call than the
first: cudagraph trees warm up first). Not in it: cuDNN's autotuning and the first runs of the
compiled kernels, which happen outside those callbacks, nor the time a rank waited for its
node's first rank (`compile_wait_s`, apart).
"""
from __future__ import annotations

import datetime
import hashlib
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

# Where a compile looks for what an earlier one left (torch/_inductor/codecache.py,
# FxGraphCache._get_tmp_dir_for_key: fxgraph/<key[1:3]>/<key>/<entry>;
# torch/_functorch/_aot_autograd/autograd_cache.py, AOTAutogradCache: aotautograd/<key>/<entry>). An
# entry is a file whose name does not start with "." (write_atomic's temporary files do). Kernels
# alone (the code cache's .py/.cpp/.so, Triton's) spare a compile at most their own build, after it
# has traced and lowered every graph again: a cache that holds only them is not called warm.
GRAPH_ENTRIES = ("fxgraph/*/*/*", "aotautograd/*/*")


def compile_cache_folder(cfg) -> str:
    """Where torch.compile's caches go: --compile_cache, else the TORCHINDUCTOR_CACHE_DIR the user
    set, else <log_dir>/.compile_cache."""
    return (cfg.compile_cache or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            or str(Path(cfg.log_dir) / ".compile_cache"))


def splits_apart(path: str) -> bool:
    """Whether `path` would not reach the C++ compiler whole. Inductor's C++ builder
    (torch/_inductor/cpp_builder.py, CppBuilder) writes the source and output files, which lie in
    the compile cache, into its command line unquoted (only -I and -L paths are quoted) and splits
    that line with shlex.split: a space, tab, quote or backslash in the path cuts it in two ("g++:
    fatal error: input file '/a' is the same as output file"; an odd quote makes shlex raise)."""
    try:
        return shlex.split(path) != [path]
    except ValueError:  # "No closing quotation"
        return True


def compile_cache_alias(folder: str) -> Path:
    """A path without spaces that leads to the compile cache `folder` (whose own path
    splits apart): a symbolic link in this user's own folder of the temporary folder,
    named after the cache's real path."""
    real = os.path.realpath(folder)
    name = hashlib.sha256(os.fsencode(real)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"pytorch-multigpu-{os.getuid()}" / name


def _first_existing(path: Path) -> Path:
    while not (path.exists() or path.is_symlink()) and path != path.parent:
        path = path.parent
    return path


def compile_cache_refusal(cfg) -> str | None:
    """Why the compile cache cannot be used, in one line (None when it can), checked before anything
    is written: a file, a symbolic link that leads nowhere, a folder that cannot be written
    (read-only, not this user's), or a path the C++ compiler cannot be given that no alias can stand
    in for. Said with where the path came from."""
    folder = Path(compile_cache_folder(cfg))
    give = "give a --compile_cache folder"
    if cfg.compile_cache:
        name = f"--compile_cache {folder}"
    elif os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        name = f"the compile cache {folder} (from TORCHINDUCTOR_CACHE_DIR)"
    else:
        name = f"the compile cache {folder} (--compile_cache's default, under --log_dir)"
        give = "give a --log_dir or --compile_cache folder"
    existing = _first_existing(folder)
    if existing.is_symlink() and not existing.exists():
        where = "" if existing == folder else f": {existing}"
        return (f"{name}{where} is a symbolic link to {os.readlink(existing)}, which does not "
                "exist: create that folder, or give another --compile_cache")
    if not existing.is_dir():
        where = "" if existing == folder else f": {existing}"
        return f"{name}{where} is a file, not a folder: {give}"
    # the kernel's answer: a read-only mount, permissions
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "cannot be written by this user"
        return f"{name}: {existing} {why}: {give} that can be written"
    if not splits_apart(os.path.abspath(folder)):
        return None
    alias = compile_cache_alias(str(folder))  # where a link will stand in for it
    if splits_apart(str(alias)):
        return (f"{name} has a space (or a quote or backslash) in its path, which inductor's C++ "
                f"builder cuts apart, and so does the temporary folder {alias.parent.parent} that "
                "would hold a link to it: give a --compile_cache path without them")
    links = alias.parent
    if (links.is_symlink()
            or links.exists() and (not links.is_dir() or links.stat().st_uid != os.getuid())):
        return (f"{name} has a space in its path, and {links}, where a link without one would "
                "stand in for it, is not a folder of this user's: remove it, or give a "
                "--compile_cache path without spaces")
    if not os.access(_first_existing(links), os.W_OK | os.X_OK):
        return (f"{name} has a space in its path, and {links.parent}, where a link "
                "without one would stand in for it, cannot be written: give a "
                "--compile_cache path without spaces")
    return None


def inductor_cache_path(folder: str) -> str:
    """The path inductor is given for the compile cache `folder`: the folder itself, or where its
    path would not reach the C++ compiler whole (splits_apart), a link to it without
    spaces (compile_cache_alias)."""
    path = os.path.abspath(folder)
    return str(compile_cache_alias(folder)) if splits_apart(path) else path


def open_compile_cache(folder: str) -> str:
    """Make `folder` ready for inductor, after every refusal: where its path splits apart,
    the folder itself and the link that stands in for it (in this user's folder of the
    temporary folder, made private, replaced atomically so that the ranks of a node can all
    make it). TORCHINDUCTOR_CACHE_DIR, which inductor reads at each compile, points at the
    path inductor is given. Returns that path."""
    path = inductor_cache_path(folder)
    if path != os.path.abspath(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        real = os.path.realpath(folder)
        alias = Path(path)
        alias.parent.mkdir(mode=0o700, exist_ok=True)
        if not (alias.is_symlink() and os.readlink(alias) == real):
            # made by inductor itself, given the path unmade
            if alias.is_dir() and not alias.is_symlink():
                shutil.rmtree(alias)
            temporary = alias.with_name(f".{alias.name}.{os.getpid()}")
            temporary.unlink(missing_ok=True)
            os.symlink(real, temporary)
            os.replace(temporary, alias)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def graph_entries(folder: str | None) -> int:
    """How many compiled graphs the cache `folder` holds, of the kinds a
    compile reads (GRAPH_ENTRIES)."""
    if not folder or not Path(folder).is_dir():
        return 0
    return sum(1 for pattern in GRAPH_ENTRIES for entry in Path(folder).glob(pattern)
               if entry.is_file() and not entry.name.startswith("."))


class CompileClock:
    """The host's time inside torch's compile callbacks, less the time spent waiting for
    the node's first rank; `events` counts the compilations and recordings. Registered
    when made, removed by close()."""

    # what a rank can read from the cache; a CUDA graph it records itself
    WAITED_FOR = ("DYNAMO", "LAZY_BACKWARD")

    def __init__(self, folder: str):
        from torch._dynamo.callback import callback_handler

        self.folder = folder
        self.inductor_path = open_compile_cache(folder)
        self.seconds = 0.0  # compiling and recording, this process's own work
        self.waited = 0.0  # waiting for the node's first rank to compile a graph first
        self.events = 0
        # (store, this rank compiles first, seconds to wait at most), from follow()
        self.leader = None
        # (trigger, compile id) -> how many such compilations so far: one store key each
        self.seen = {}
        self._began = self._waited_before = 0.0
        self._compiling = None  # the store key of the compilation under way
        self._handler = callback_handler
        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)

    def follow(self, leader) -> None:
        """In a process group: `leader` is (a store shared with the node's first rank, whether
        this rank is it, the longest wait), or None where this rank compiles alone
        (common/guards.py, compile_leader)."""
        self.leader = leader

    def _key(self, args) -> str | None:
        trigger = args.callback_trigger.name
        if self.leader is None or trigger not in self.WAITED_FOR:
            return None
        count = self.seen[trigger,
                          args.compile_id] = self.seen.get((trigger, args.compile_id), 0) + 1
        return f"compiled/{trigger}/{args.compile_id}/{count}"

    def _start(self, args) -> None:
        self._began, self._waited_before = time.perf_counter(), self.waited
        self._compiling = self._key(args)
        if self._compiling is None or self.leader[1]:
            return
        store, _, timeout_s = self.leader
        try:  # the first rank compiles this graph first; then it is in the cache
            store.wait([self._compiling], datetime.timedelta(seconds=timeout_s))
        # it never did (DistStoreError): this rank compiles on its own from now on
        except RuntimeError:
            self.leader = None
        self.waited += time.perf_counter() - self._began

    def _end(self, args) -> None:
        self.events += 1
        if self._compiling is not None and self.leader is not None and self.leader[1]:
            # the node's other ranks may read this graph now
            self.leader[0].set(self._compiling, "1")
        self.seconds += time.perf_counter() - self._began - (self.waited - self._waited_before)

    def close(self) -> None:
        for callbacks, callback in ((self._handler.start_callbacks, self._start),
                                    (self._handler.end_callbacks, self._end)):
            if callback in callbacks:  # torch._dynamo.reset() clears them all
                callbacks.remove(callback)
