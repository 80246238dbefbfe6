"""fusegrad.data: datasets and a prefetching DataLoader with PyTorch's names (numpy is all it needs).

    from fusegrad.data import DataLoader, load_digits
    x, y = load_digits(split="train")
    for xb, yb in DataLoader((x / 16, y), batch_size=64, shuffle=True, seed=0): ...
"""
from fusegrad.data.loader import (Dataset, IterableDataset, ChainDataset, TensorDataset, Subset, ConcatDataset,
                                  random_split, Sampler, SequentialSampler, RandomSampler, SubsetRandomSampler,
                                  WeightedRandomSampler, BatchSampler, DataLoader, default_collate)
from fusegrad.data.datasets import load_digits

__all__ = ["Dataset", "IterableDataset", "ChainDataset", "TensorDataset", "Subset", "ConcatDataset", "random_split",
           "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler",
           "BatchSampler", "DataLoader", "default_collate", "load_digits"]
