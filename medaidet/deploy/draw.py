"""An image with its detections drawn in the course's class colours (Pillow only)."""
import numpy as np

from medaidet.data import CLASS_COLORS


def draw_detections(image, bboxes, labels, label_names, width: int = 2):
    """``image`` (3, H, W) RGB 0-255 as a Pillow image with each box ``(y_min, x_min, y_max,
    x_max)`` outlined in its class's colour and the count per class written at the top."""
    from PIL import Image, ImageDraw, ImageFont

    picture = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8).transpose(1, 2, 0))
    pen = ImageDraw.Draw(picture)
    for (y0, x0, y1, x1), label in zip(bboxes, labels):
        pen.rectangle([float(x0), float(y0), float(x1), float(y1)],
                      outline=CLASS_COLORS[label_names[label]], width=width)
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(label_names))
    try:
        font = ImageFont.load_default(size=max(12, picture.height // 28))
    except TypeError:       # Pillow < 10.1: one size only
        font = ImageFont.load_default()
    x = 4
    for name, n in zip(label_names, counts):
        text = f"{name} {n}"
        left, top, right, bottom = pen.textbbox((x, 4), text, font=font)
        pen.rectangle([left - 3, top - 3, right + 3, bottom + 3], fill="white")
        pen.text((x, 4), text, fill=CLASS_COLORS[name], font=font)
        x = right + 12
    return picture
