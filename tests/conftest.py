import fcntl
import os
import pickle

# Before torch loads OpenMP: threads that wait sleep instead of spinning. With 2 threads on a busy
# machine, spinning made iterations 4-50x slower (a notebook test once hit its cell timeout).
# The notebooks' kernels inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("CI", "1")  # Pyro: no progress bars in tests

#: the files of the slowest tests (a notebook or a study end to end, process groups), collected
#: first: pytest-xdist hands tests out in collection order, so a long test left to the end keeps
#: one worker busy while the other has nothing left to do
SLOW_FILES = ("test_tutorials.py", "test_distributed.py", "test_cli.py")


def pytest_configure(config):
    # xdist's first hand-out is a block of consecutive tests per worker (an eighth of them with 2): the
    # slow files would all go to the first worker; one test at a time lets each worker take the next
    if getattr(config.option, "maxschedchunk", "absent") is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(SLOW_FILES)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _single_thread_and_seed():
    import pyro

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def interrupt_study_at(monkeypatch):
    """``interrupt_study_at(k)``: the MNIST study's EntropySGLD raises KeyboardInterrupt (Ctrl-C) at
    iteration ``k`` (warm-up included); its other samplers run as they are."""
    from pyro_flat.experiments.mnist79 import study as mnist79
    from pyro_flat.kernels import EntropySGLD

    def at(iteration: int) -> None:
        class Interrupted(EntropySGLD):
            def sample(self, params):
                if self._iteration == iteration:
                    raise KeyboardInterrupt
                return super().sample(params)

        make = mnist79.make_study_kernel
        monkeypatch.setattr(mnist79, "make_study_kernel", lambda name, c, model: (
            Interrupted(model, eta=c.eta, step_size=c.step_size, preconditioner=c.preconditioner)
            if name == "entropy-sgld" else make(name, c, model)))

    return at


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory):
    """``once_per_run(key, make)``: ``make()``'s value, made once per test run for a module-scoped fixture.

    Under pytest-xdist a module-scoped fixture is made once per worker that runs one of its tests, and with
    the tests handed out one at a time (above) both workers run some: test_distributed.py's rank processes
    ran twice (30 s each). Here the first worker to ask makes the value (a picklable one) and leaves it in the
    run's temporary folder, which the workers share; the other waits for it and reads it. (Also without xdist:
    a test that parametrizes such a fixture itself gets a fixture instance of its own, which reads the value.)
    A ``make()`` that raises leaves nothing: the next to ask makes it again (and fails in its own tests too).
    """
    root = tmp_path_factory.getbasetemp()  # the run's; under xdist each worker's is a folder in the run's
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent

    def shared(key: str, make):
        path = root / f"once-per-run-{key}.pickle"
        with open(root / f"once-per-run-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if path.exists():
                return pickle.loads(path.read_bytes())
            value = make()
            staged = path.with_suffix(".partial")
            staged.write_bytes(pickle.dumps(value))
            staged.replace(path)
            return value

    return shared
