"""The tasks the one training loop trains (``raydiff.train.task.Task``): one module each."""
