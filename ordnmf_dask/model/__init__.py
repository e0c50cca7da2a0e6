"""Pure numpy / scipy numerics of IG-OrdNMF: block kernels, gamma updates, thresholds."""
