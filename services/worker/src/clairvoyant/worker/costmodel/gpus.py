"""GPU specifications for the roofline cost model (``roofline.CostModel``).

Peak numbers come from NVIDIA's datasheets; the efficiency factors say how much of each peak a
serving engine actually reaches and are fitted against published throughput (docs/costmodel.md,
``calibration.py``).  Bandwidths are bytes per second in ONE direction: that is what a single
transfer sees (datasheets quote PCIe and NVLink as the sum of both directions).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
MIB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    name: str
    hbm_bytes: int  # device memory as the driver reports it (nvidia-smi "Total")
    hbm_bandwidth: float  # bytes/s, peak
    bf16_flops: float  # FLOP/s, dense bf16 tensor-core peak (no sparsity)
    pcie_bandwidth: float  # bytes/s per direction, peak of the host link (L2 swap path)
    nvlink_bandwidth: float  # bytes/s per direction per GPU (tensor-parallel all-reduce path)
    network_bandwidth: float  # bytes/s per GPU to other nodes (KV migration between replicas)
    mfu: float  # achieved fraction of bf16_flops on compute-bound steps (large prefills)
    mbu: float  # achieved fraction of hbm_bandwidth on memory-bound steps (decode)
    pcie_efficiency: float = 0.8  # achieved fraction of pcie_bandwidth with pinned host buffers
    network_efficiency: float = 0.8  # achieved fraction of network_bandwidth (RDMA, large messages)
    allreduce_latency: float = 10e-6  # seconds per all-reduce, independent of size (launch + sync)
    step_overhead: float = 1.0e-3  # seconds per engine step: scheduling, launches, sampling
    host_dram_bytes: int = 0  # the node's host DRAM per GPU (the L2 pool's ceiling); 0: unknown

    def __post_init__(self) -> None:
        for name in ("mfu", "mbu", "pcie_efficiency", "network_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"GpuSpec.{name} must be in (0, 1], got {value}")


# NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): HBM2e 80 GB at 2,039 GB/s; BF16 tensor
# 312 TFLOPS dense (624 with sparsity); PCIe Gen4 64 GB/s (both directions); NVLink 600 GB/s (both
# directions).  nvidia-smi reports 81,920 MiB.  DGX A100 datasheet: 8x 200 Gb/s HDR InfiniBand for
# 8 GPUs, i.e. 25 GB/s per GPU.
A100_80G = GpuSpec(
    name="A100-80G",
    hbm_bytes=81_920 * MIB,
    hbm_bandwidth=2_039 * GB,
    bf16_flops=312e12,
    pcie_bandwidth=32 * GB,
    nvlink_bandwidth=300 * GB,
    network_bandwidth=25 * GB,
    mfu=0.65,
    mbu=0.90,
    allreduce_latency=12e-6,
    step_overhead=1.0e-3,
    host_dram_bytes=1_000 * GB // 8,  # DGX A100: 1 TB system memory for 8 GPUs
)

# NVIDIA H100 Tensor Core GPU datasheet (H100 SXM 80GB): HBM3 80 GB at 3.35 TB/s; BF16 tensor
# 989 TFLOPS dense (1,979 with sparsity); PCIe Gen5 128 GB/s (both directions); NVLink 900 GB/s
# (both directions).  nvidia-smi reports 81,559 MiB.  DGX H100 datasheet: 8x 400 Gb/s ConnectX-7
# for 8 GPUs, i.e. 50 GB/s per GPU.
H100_80G = GpuSpec(
    name="H100-80G",
    hbm_bytes=81_559 * MIB,
    hbm_bandwidth=3_350 * GB,
    bf16_flops=989e12,
    pcie_bandwidth=64 * GB,
    nvlink_bandwidth=450 * GB,
    network_bandwidth=50 * GB,
    mfu=0.45,
    mbu=0.85,
    allreduce_latency=8e-6,
    step_overhead=1.0e-3,
    host_dram_bytes=2_000 * GB // 8,  # DGX H100: 2 TB system memory for 8 GPUs
)

GPUS: dict[str, GpuSpec] = {spec.name.lower(): spec for spec in (A100_80G, H100_80G)}


def get_gpu(name: str) -> GpuSpec:
    """The spec named ``name`` (case-insensitive); ``ValueError`` listing the known names otherwise."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        known = ", ".join(spec.name for spec in GPUS.values())
        raise ValueError(f"unknown GPU {name!r}; choose one of: {known}") from None
