"""The models every mode trains: PyramidNet (Han, Kim & Kim, CVPR 2017) for 32x32 images, the
default, or any classification model torchvision lists, by name (models/factory.py); and the rule
that finds any model's repeated blocks, which FSDP shards one at a time (models/blocks.py)."""
from models.blocks import repeated_blocks
from models.factory import (PYRAMIDNET, build_model, model_names, model_refusal, on_meta,
                            unknown_model)
from models.pyramidnet import PyramidNet, pyramidnet

__all__ = ["PYRAMIDNET", "PyramidNet", "build_model", "model_names", "model_refusal", "on_meta",
           "pyramidnet", "repeated_blocks", "unknown_model"]
