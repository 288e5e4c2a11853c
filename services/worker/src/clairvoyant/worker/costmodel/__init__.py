"""A roofline cost model of LLM serving on named GPUs (docs/costmodel.md).

``gpus`` and ``models`` hold the specifications, ``roofline.CostModel`` the predictions (engine step,
KV capacity, swap, migration, start-up), ``calibration`` the published numbers it is checked against.
Pure: no clock, no I/O, so the emulated runner, the simulator and the autoscaler share it.
"""

from clairvoyant.worker.costmodel.gpus import GPUS, GpuSpec, get_gpu
from clairvoyant.worker.costmodel.models import MODELS, ModelSpec, get_model
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel, StepCost

__all__ = ["GPUS", "MODELS", "BatchItem", "CostModel", "GpuSpec", "ModelSpec", "StepCost", "get_gpu", "get_model"]
