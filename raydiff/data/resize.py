"""Channel conversion and improved-diffusion's resize rule, applied once at prepare time."""

from __future__ import annotations

import numpy as np
from PIL import Image

# Modes that carry transparency once expanded; they are composited on white so that
# transparent regions do not turn into whatever colour the invisible pixels happen to hold.
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_WHITE_RGBA = (255, 255, 255, 255)


def to_channels(image: Image.Image, *, channels: int) -> Image.Image:
    """Return ``image`` as mode ``L`` (channels=1) or ``RGB`` (channels=3).

    Grey is replicated to RGB, RGB becomes grey with ITU-R 601-2 luma (PIL's ``L``), palette
    images are expanded (keeping their transparency), 16-bit grey is scaled to 8 bits, and
    anything with alpha is composited on a white background.
    """
    if channels not in (1, 3):
        raise ValueError(f"channels={channels!r} is invalid; valid values: 1, 3")
    target = "L" if channels == 1 else "RGB"
    mode = image.mode
    if mode == target:
        return image
    if mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif mode.startswith("I;16") or mode in ("I", "F"):
        # PIL's convert("L") clips 16-bit values at 255 instead of scaling them.
        array = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if mode != "F" else max(float(array.max()), 1.0)
        image = Image.fromarray(np.clip(array * (255.0 / peak) + 0.5, 0, 255).astype(np.uint8))
    elif mode == "1":
        image = image.convert("L")
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, _WHITE_RGBA)
        image = Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode != target:
        image = image.convert(target)
    return image


def resize_center_crop(image: Image.Image, *, image_size: int) -> Image.Image:
    """Resize so the short side is ``image_size``, then centre-crop to a square.

    This is improved-diffusion's rule (``ImageDataset.__getitem__``): BOX-halve while the short
    side is at least twice the target (cheap, alias-free downsampling), then one BICUBIC resize,
    then a centre crop. Sources smaller than the target (Fashion-MNIST's 28 px to 32 px) are
    therefore upsampled with BICUBIC, which is what the rule gives.
    """
    while min(*image.size) >= 2 * image_size:
        image = image.resize(tuple(x // 2 for x in image.size), resample=Image.BOX)
    scale = image_size / min(*image.size)
    new_size = tuple(round(x * scale) for x in image.size)
    if new_size != image.size:
        image = image.resize(new_size, resample=Image.BICUBIC)
    width, height = image.size
    if (width, height) != (image_size, image_size):
        left = (width - image_size) // 2
        top = (height - image_size) // 2
        image = image.crop((left, top, left + image_size, top + image_size))
    return image


def pad_center(image: Image.Image, *, image_size: int) -> Image.Image:
    """Pad (with black) a source no larger than ``image_size`` to a centred square.

    The alternative to resampling for small sources (``--fit pad``): Fashion-MNIST 28 px becomes
    32 px with its pixels unchanged. Larger sources are refused rather than silently cropped.
    """
    width, height = image.size
    if width > image_size or height > image_size:
        raise ValueError(
            f"fit='pad' needs images no larger than image_size={image_size}, got {width}x{height}; "
            "use fit='resize' for larger sources"
        )
    if (width, height) == (image_size, image_size):
        return image
    canvas = Image.new(image.mode, (image_size, image_size), 0)
    canvas.paste(image, ((image_size - width) // 2, (image_size - height) // 2))
    return canvas
