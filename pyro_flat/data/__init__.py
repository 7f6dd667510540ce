"""Data: MNIST 7-vs-9 and the digits' splits (:mod:`~.datasets`, documented as ``pyro_flat.datasets``), the
files of MNIST (:mod:`~.mnist_files`) and of CIFAR, SVHN and CIFAR-10-C (:mod:`~.cifar_files`) read and
checked, and the shifted test sets: corruptions (:mod:`~.corruptions`), rotations and noise (:mod:`~.shift`)."""
