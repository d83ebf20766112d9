"""The Ray layer: the only package that imports ray.train / ray.tune / actors.

``trainer.run_training_job`` drives one TorchTrainer; ``worker.train_loop_per_worker`` runs on
every rank; ``sampler_actor`` holds the loss-aware sampler's shared history.
"""
