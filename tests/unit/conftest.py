"""Unit tier: one intra-op thread. The tensors here are tiny; with two threads every parallel op
waits for a second core, which on a busy 2-core machine makes a 3 s tier take 40 s."""

import torch

torch.set_num_threads(1)
