"""Programs in and out of other systems: the StableHLO importer and ``jax.export`` serialisation."""
