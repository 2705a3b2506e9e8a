"""Graph transformations: reverse mode (``autodiff``), batching (``vmap``), forward mode (``jvp``),
Jacobians, custom derivative rules and rematerialisation."""
