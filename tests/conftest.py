import os

import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
