"""What runs on a fitted model: evaluation, recommendations, fold-in, predictive checks."""
