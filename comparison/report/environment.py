"""report.md's "Environment": the GPUs, the versions, the CPU and host, and how the GPUs are
linked (`nvidia-smi topo -m`), as comparison/environment.py gathered them."""
from __future__ import annotations

from comparison.environment import gpu_summary


def environment_section(env: dict, topology: str | None) -> list[str]:
    lines = [f"- GPUs: {gpu_summary(env) or 'none'}",
             f"- driver {env.get('driver') or '—'}, CUDA {env.get('cuda') or '—'}, cuDNN "
             f"{env.get('cudnn') or '—'}, NCCL {env.get('nccl') or '—'}, torch {env.get('torch')}, "
             f"Python {env.get('python')}",
             f"- CPU: {env.get('cpu')}, {env.get('cpu_count')} cores; host {env.get('hostname')}",
             ""]
    if topology:
        lines += ["`nvidia-smi topo -m` (NV# = # bonded NVLinks; PIX/PXB/PHB/NODE/SYS = PCIe "
                  "paths, slowest last):", "", "```", topology.rstrip(), "```"]
    else:
        lines.append("`nvidia-smi topo -m`: not available on this machine (no NVIDIA driver).")
    return lines
