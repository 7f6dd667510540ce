import os

import pytest
import torch

os.environ.setdefault("CI", "1")  # Pyro: no progress bars in tests


@pytest.fixture(autouse=True)
def _single_thread_and_seed():
    import pyro

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield
    torch.set_num_threads(threads)
