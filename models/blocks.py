"""The repeated blocks of a model: what FSDP shards one at a time (fsdp/train.py wraps each in
`fully_shard`, then the root), and what comparison/projection.py models as FSDP's units.

The rule, for any model: a block is a child of an `nn.Sequential` or `nn.ModuleList` that holds
parameters, is not itself a plain Sequential or ModuleList (those are only containers: the rule
looks inside them), is inside no other block, and whose class is shared by at least one other
block. PyramidNet's BasicBlock or Bottleneck (in its three stages), ResNet's BasicBlock or
Bottleneck (in layer1 to layer4), ViT's EncoderBlock (in encoder.layers); a block's own repeated
parts (ViT's MLP layers, a ResNet block's downsample) stay inside it, and a class found once
outside the blocks (ViT's classifier, a stem) is the root's. A model with nothing repeated has no
blocks: FSDP then shards it as one unit, the root.
"""
from __future__ import annotations

from torch import nn

CONTAINERS = (nn.Sequential, nn.ModuleList)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of `model` (the module docstring's rule), in the order the model registers them
    (its forward order for every model the factory builds); [] when nothing is repeated. Works on
    the meta device: only the structure is read."""
    candidates = [child for module in model.modules() if isinstance(module, CONTAINERS)
                  for child in module.children()
                  if type(child) not in (nn.Sequential, nn.ModuleList)
                  and next(child.parameters(), None) is not None]
    kinds = {type(child) for child in candidates}
    while True:  # a class is repeated when two blocks have it; blocks inside blocks do not count
        blocks = outermost([child for child in candidates if type(child) in kinds])
        counts = {kind: sum(type(block) is kind for block in blocks) for kind in kinds}
        repeated = {kind for kind, count in counts.items() if count >= 2}
        if repeated == kinds:
            return order_of_registration(model, blocks)
        kinds = repeated


def outermost(modules: list[nn.Module]) -> list[nn.Module]:
    """Those of `modules` that are inside none of the others."""
    inside = {id(sub) for module in modules for sub in module.modules() if sub is not module}
    return [module for module in modules if id(module) not in inside]


def order_of_registration(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """`blocks` once each, in model.modules()' order."""
    chosen = {id(block) for block in blocks}
    seen, ordered = set(), []
    for module in model.modules():
        if id(module) in chosen and id(module) not in seen:
            seen.add(id(module))
            ordered.append(module)
    return ordered
