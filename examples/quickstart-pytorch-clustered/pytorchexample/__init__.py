"""pytorchexample: Flower's quickstart-pytorch, made clustered with fl-clusters."""
