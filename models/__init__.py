"""PyramidNet (Han, Kim & Kim, CVPR 2017) for 32x32 images: the model every mode trains."""
from models.pyramidnet import PyramidNet, pyramidnet

__all__ = ["PyramidNet", "pyramidnet"]
