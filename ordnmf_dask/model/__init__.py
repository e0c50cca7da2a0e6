"""Pure numerics of IG-OrdNMF and dcPF on numpy arrays: block kernels, updates, metrics."""
