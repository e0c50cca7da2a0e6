"""The saved model on disk: factor chunks written by the workers and the model's attributes."""
