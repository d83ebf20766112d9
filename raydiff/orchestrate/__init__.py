"""The Ray layer: the only package that imports ray.train / ray.tune / actors.

``ray_session`` joins or starts the Ray cluster and keeps Ray's chatter off the console;
``trainer.run_training_job`` drives one Ray Train run (a ``TorchTrainer``);
``worker.train_loop_per_worker`` runs on every rank (``ray_runtime``); ``loss_history_actor``
holds the loss-aware timestep sampler's shared history.
"""
