"""The Ray layer: the only package that imports ray.train / ray.tune / actors.

``trainer.run_training_job`` drives one Ray Train run (``torch_backend`` sets up its PyTorch
process group); ``worker.train_loop_per_worker`` runs on every rank (``ray_runtime``);
``sampler_actor`` holds the loss-aware sampler's shared history.
"""
