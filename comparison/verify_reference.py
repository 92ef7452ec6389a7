"""The reference of compare.py --verify's check 2: what N DDP processes without SyncBatchNorm
compute, computed in one process without DDP (`reference_training`) from train.py's own pieces:
its seeding, loaders, augmentation, model, precision, optimizer, schedule and loss scaling."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from common.augmentation import augmentation
from common.config import Config
from common.data import dataset_info, image_size, load_datasets
from common.devices import seed_everything
from common.loaders import make_loader
from common.optim import build_optimizer, lr_schedule
from common.performance import autocast, grad_scaler, memory_format, resolve_fast_path
from comparison.matrix import cpu_threads
from models import build_model


def reference_training(cfg: Config, world_size: int,
                       device: torch.device) -> dict[str, torch.Tensor]:
    """What `world_size` DDP processes without SyncBatchNorm compute, in this one process without
    DDP: every global batch is the ranks' shares (rank r's DistributedSampler indices, batches of
    batch_size / world_size), each share goes through its own forward pass in its own autocast
    region (so BatchNorm normalises it alone and autocast casts the weights for it alone, as on its
    rank), and the loss is the mean of the shares' losses (DDP averages the ranks' gradients).
    train.py's seeding, loaders, augmentation, model, precision, optimizer, schedule and loss
    scaling, for cfg.epochs epochs of at most cfg.max_steps steps; on the CPU on as many intra-op
    threads as each run has (matrix.cpu_threads). Returns the trained parameters, on the CPU."""
    cfg = resolve_fast_path(cfg, device)  # --amp and --channels_last as the runs resolved them
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads())
    try:
        return _train_reference(cfg, world_size, device)
    finally:
        torch.set_num_threads(threads)


def _train_reference(cfg: Config, world_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    # train.py: seed, then the loaders (no global RNG drawn), then the model
    seed_everything(cfg.seed)
    train_set, _ = load_datasets(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed,
                                 image_size(cfg))
    kind = cfg.loader or ("gpu" if device.type == "cuda" else "torchvision")
    loaders = []
    for rank in range(world_size):
        sampler = DistributedSampler(train_set, world_size, rank, shuffle=cfg.shuffle,
                                     seed=cfg.seed)
        loaders.append(make_loader(kind, train_set, sampler, cfg.batch_size // world_size, device,
                                   train=True, augment=augmentation(cfg),
                                   num_workers=cfg.num_workers, seed=cfg.seed,
                                   memory_format=memory_format(cfg)))
    model = build_model(cfg, dataset_info(cfg))
    model = model.to(device, memory_format=memory_format(cfg))
    optimizer = build_optimizer(model, cfg, device)
    scheduler, scaler = lr_schedule(optimizer, cfg, len(loaders[0])), grad_scaler(cfg, device)
    model.train()
    step = 0
    for epoch in range(cfg.epochs):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)  # as train.py does: the epoch's order
            loader.start_epoch(epoch)  # and its augmentation
        for shares in zip(*loaders):
            losses = []
            # an autocast region per share, as each rank has its own: autocast caches a weight's
            # bf16 copy per region, and a shared copy would add the shares' gradients in bf16
            for images, labels in shares:
                with autocast(cfg, device):
                    losses.append(F.cross_entropy(model(images), labels))
            loss = sum(losses) / world_size
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            if cfg.reached_max_steps(step):
                break
        if cfg.reached_max_steps(step):
            break
    params = dict(model.named_parameters())  # in the paper's shapes, as model.pt holds them
    return {name: value.cpu().clone() for name, value in model.state_dict().items()
            if name in params}
