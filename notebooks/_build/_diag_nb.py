"""Small helpers shared by the diagnosis notebook builders (00, 10, 20, 21, 22).

A builder lists cells as ``md(...)`` / ``code(...)`` and calls ``write(name, cells)``; the notebook is
then executed in place by nbconvert (see notebooks/_build/README.md).
"""

from __future__ import annotations


from _nbkit import NOTEBOOKS, code, execute, md, write  # noqa: F401  (re-exported to the builders)


SETUP = '''\
# Setup: choose the data source, seed everything, keep the CPU quiet.
import os, random, sys, warnings
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
import numpy as np
import pandas as pd
import torch

GPU = torch.cuda.is_available()
random.seed(0); np.random.seed(0); torch.manual_seed(0)
if not GPU:
    torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=UserWarning)
pd.set_option("display.width", 160, "display.max_colwidth", 70)
print("mode:", "live CUDA capture on " + torch.cuda.get_device_name(0) if GPU
      else "recorded H200 samples (no CUDA device here)")
'''
