"""A user's own model for `tools/torch_tree_dump.py --model tree_dump_models:tied_pair`."""
import torch.nn as nn


class TiedPair(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.module = nn.Linear(4, 4)  # a user child named like a wrapper's slot
        self.out = nn.Linear(4, 5, bias=False)
        self.out.weight = self.embed.weight


def tied_pair():
    return TiedPair()
