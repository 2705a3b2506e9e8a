"""Neural-network building blocks: the functional layers of ``kn.fn``, activations, initialisers,
losses and metrics."""
