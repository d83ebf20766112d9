"""Config -> core objects: the UNet, the classifier and the diffusion a typed config describes.

improved-diffusion's ``script_util`` does this from keyword flags; here it takes the typed
sections of :mod:`raydiff.config`. It lives above both, so ``raydiff.core`` stays free of any
config (``import raydiff.core`` loads no config, data or Ray module).
"""

from __future__ import annotations

from raydiff.config import DiffusionConfig, ExperimentConfig, ModelConfig
from raydiff.core.gaussian_diffusion import LossType, ModelMeanType, ModelVarType
from raydiff.core.respace import SpacedDiffusion, space_timesteps
from raydiff.core.schedules import get_named_beta_schedule
from raydiff.core.unet import EncoderUNetModel, SuperResModel, UNetModel


def create_model(config: ModelConfig, *, learn_sigma: bool, super_res: bool = False) -> UNetModel:
    """The UNet described by ``config``; ``learn_sigma`` doubles its output channels;
    ``super_res`` makes it improved-diffusion's upsampler (``SuperResModel``: the same UNet
    conditioned on ``low_res``, as ``sr_create_model`` builds it at ``large_size``)."""
    network = SuperResModel if super_res else UNetModel
    return network(
        image_size=config.image_size,
        in_channels=config.in_channels,
        model_channels=config.num_channels,
        out_channels=config.in_channels * (2 if learn_sigma else 1),
        num_res_blocks=config.num_res_blocks,
        attention_resolutions=config.attention_downsample_rates(),
        dropout=config.dropout,
        channel_mult=config.channel_mult_tuple(upsampler=super_res),
        num_classes=config.num_classes if config.class_cond else None,
        use_checkpoint=config.use_checkpoint,
        use_fp16=config.use_fp16,
        num_heads=config.num_heads,
        num_head_channels=config.num_head_channels,
        num_heads_upsample=config.num_heads_upsample,
        use_scale_shift_norm=config.use_scale_shift_norm,
        resblock_updown=config.resblock_updown,
        use_new_attention_order=config.use_new_attention_order,
    )


def create_classifier(config: ExperimentConfig) -> EncoderUNetModel:
    """guided-diffusion's ``create_classifier``: the ``EncoderUNetModel`` of the classifier
    section, for the model section's images and classes."""
    model, classifier = config.model, config.classifier
    return EncoderUNetModel(
        image_size=model.image_size,
        in_channels=model.in_channels,
        model_channels=classifier.classifier_width,
        out_channels=model.num_classes,
        num_res_blocks=classifier.classifier_depth,
        attention_resolutions=classifier.attention_downsample_rates(model.image_size),
        channel_mult=classifier.channel_mult(model.image_size),
        use_fp16=classifier.classifier_use_fp16,
        num_head_channels=classifier.classifier_num_head_channels,
        use_scale_shift_norm=classifier.classifier_use_scale_shift_norm,
        resblock_updown=classifier.classifier_resblock_updown,
        pool=classifier.classifier_pool,
    )


def create_gaussian_diffusion(config: DiffusionConfig) -> SpacedDiffusion:
    """The (possibly respaced) diffusion described by ``config``.

    Loss selection follows improved-diffusion: use_kl -> RESCALED_KL; else rescale_learned_sigmas
    -> RESCALED_MSE (L_hybrid when learn_sigma); else MSE.
    """
    betas = get_named_beta_schedule(config.noise_schedule, config.diffusion_steps)
    if config.use_kl:
        loss_type = LossType.RESCALED_KL
    elif config.rescale_learned_sigmas:
        loss_type = LossType.RESCALED_MSE
    else:
        loss_type = LossType.MSE
    if config.learn_sigma:
        var_type = ModelVarType.LEARNED_RANGE
    elif config.sigma_small:
        var_type = ModelVarType.FIXED_SMALL
    else:
        var_type = ModelVarType.FIXED_LARGE
    respacing = config.timestep_respacing or [config.diffusion_steps]
    return SpacedDiffusion(
        use_timesteps=space_timesteps(config.diffusion_steps, respacing),
        betas=betas,
        model_mean_type=ModelMeanType.START_X if config.predict_xstart else ModelMeanType.EPSILON,
        model_var_type=var_type,
        loss_type=loss_type,
        rescale_timesteps=config.rescale_timesteps,
    )
