"""The PNG bytes stored in a shard: one source image (a file or an array row) encoded, and a
stored image decoded back to pixels.

The encoders run in ``multiprocessing`` workers, so they take and return only picklable
values and never raise for a bad image: a bad image comes back as an error string.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image

from raydiff.data.resize import pad_center, resize_center_crop, to_channels
from raydiff.errors import UserInputError

Fit = Literal["resize", "pad"]
FITS: tuple[str, ...] = ("resize", "pad")


@dataclass(frozen=True)
class ImageSpec:
    """What every stored image looks like."""

    image_size: int
    channels: int
    fit: Fit = "resize"
    # zlib level 1: PNG files ~10% larger than level 6 but encoded ~3x faster, which is what
    # keeps 70k images under two minutes on two cores. The pipeline decodes either equally fast.
    compress_level: int = 1


# (png bytes, None) for a good image, (None, "reason") for a bad one.
EncodeResult = tuple[bytes | None, str | None]


def encode_image(image: Image.Image, *, spec: ImageSpec) -> bytes:
    """Convert channels, resize or pad, and encode as PNG."""
    # Channels first: compositing alpha before resampling keeps invisible pixels out of the
    # bicubic kernel, and resampling one grey channel is cheaper than three.
    image = to_channels(image, channels=spec.channels)
    if spec.fit == "resize":
        image = resize_center_crop(image, image_size=spec.image_size)
    else:
        image = pad_center(image, image_size=spec.image_size)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=spec.compress_level)
    return buffer.getvalue()


def encode_file(path: str, *, spec: ImageSpec) -> EncodeResult:
    """Encode the image file at ``path``; unreadable, empty or truncated files give a reason."""
    try:
        if os.path.getsize(path) == 0:
            return None, "empty file (0 bytes)"
        with Image.open(path) as image:
            # load() forces a full decode here, so truncation is detected now (PIL's default
            # LOAD_TRUNCATED_IMAGES=False makes it raise) instead of yielding a half-grey image.
            image.load()
            return encode_image(image, spec=spec), None
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


def encode_array(array: np.ndarray, *, spec: ImageSpec) -> EncodeResult:
    """Encode one uint8 image given as [H, W] or [H, W, C] with C in 1, 3, 4."""
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    try:
        return encode_image(Image.fromarray(np.ascontiguousarray(array)), spec=spec), None
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


def encode_chunk(task: tuple[list[str] | np.ndarray, ImageSpec]) -> list[EncodeResult]:
    """Encode a chunk of paths or array rows (the unit of work sent to a pool worker)."""
    items, spec = task
    if isinstance(items, np.ndarray):
        return [encode_array(row, spec=spec) for row in items]
    return [encode_file(path, spec=spec) for path in items]


def decode_png(png: bytes, *, image_size: int, channels: int, key: str = "") -> np.ndarray:
    """A stored image as uint8 ``[H, W, C]``; every reader of shards decodes through here.

    Raises ``UserInputError`` (naming the row's ``key`` when given) when the image is not the
    ``image_size`` x ``image_size`` x ``channels`` its manifest says.
    """
    with Image.open(io.BytesIO(png)) as image:
        array = np.asarray(image)
    if array.shape[:2] != (image_size, image_size) or array.size != image_size**2 * channels:
        row = f"row {key!r}" if key else "a row"
        raise UserInputError(
            f"{row} is a {'x'.join(map(str, array.shape))} image, but the manifest says "
            f"{image_size}x{image_size}x{channels}: the dataset is inconsistent, prepare it again"
        )
    return array.reshape(image_size, image_size, channels)
