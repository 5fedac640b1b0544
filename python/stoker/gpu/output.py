"""An image pipeline's output conversion on the GPU: with ``device="cuda"``, a native image
dataset whose transform ends in a float ``ToTensor``/``ToDtype`` (and ``Normalize``) has its
workers write uint8 batches, the copy moves uint8 (a quarter of float32's bytes over PCIe, a
quarter of the pinned memory), and the conversion runs on the device after the copy.

The conversion is the CPU path's own arithmetic in float32 (``v / 255`` where ToTensor scales,
then ``(x - mean) / std``, then the dtype, rounded to nearest even), so a GPU batch equals the
CPU path's batch bit for bit; tests check it on CPU tensors. It runs on the consumer's current
stream once the feed hands a batch over, before a batch transform (MixUp and CutMix blend
normalized images, as torchvision's recipes do).

Not moved (the workers convert, as without a GPU): a pipeline whose RandomErasing comes after
ToTensor (it writes normalized values), a uint8 output, GPU decode (``decode="cuda"``: its kernels
write the final dtype already), and a transform that goes on in Python.
"""

from __future__ import annotations

__all__ = ["DeviceOutput", "convert_images"]

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def convert_images(images, dtype, scale, mean, std, layout):
    """uint8 images ([n, 3, H, W] for "CHW", [n, H, W, 3] for "HWC") as the pipeline's output
    tensor: float32 ``v / 255`` (with ``scale``), ``(x - mean) / std`` per channel (when mean is
    not None), then ``dtype``. Any device."""
    import torch
    x = images.to(torch.float32)
    if scale:
        x.div_(255.0)
    if mean is not None:
        shape = (1, 3, 1, 1) if layout == "CHW" else (1, 1, 1, 3)
        m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(shape)
        s = torch.tensor(std, dtype=torch.float32, device=x.device).view(shape)
        x.sub_(m).div_(s)
    target = getattr(torch, _DTYPES[dtype])
    return x if target is torch.float32 else x.to(target)


class DeviceOutput:
    """The conversion of one loader (see the module docstring): ``finish(feed)`` wraps the
    feed's GPU batches, ``(images, labels, ...)``, or ``((images, ...), params)`` pairs when a
    batch transform tagged them (``tagged``)."""

    def __init__(self, dtype, scale, mean, std, layout):
        self.dtype, self.scale, self.layout = dtype, scale, layout
        self.mean, self.std = mean, std

    def describe(self):
        norm = ", Normalize" if self.mean is not None else ""
        return f"uint8 over the copy; ToTensor({self.dtype}{norm}) on the GPU"

    def convert(self, batch):
        """The batch with its images converted: a tuple or list whose first item they are, or
        the images alone."""
        if not isinstance(batch, (tuple, list)):
            return convert_images(batch, self.dtype, self.scale, self.mean, self.std, self.layout)
        images = convert_images(batch[0], self.dtype, self.scale, self.mean, self.std,
                                self.layout)
        return (images, *batch[1:]) if isinstance(batch, tuple) else [images, *batch[1:]]

    def finish(self, feed, tagged=False):
        return _Converted(self, feed, tagged)


class _Converted:
    def __init__(self, output, feed, tagged):
        self._output = output
        self._feed = feed
        self._tagged = tagged

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._feed)

    def __next__(self):
        item = next(self._feed)
        if self._tagged:
            batch, params = item
            return self._output.convert(batch), params
        return self._output.convert(item)

    def close(self):
        self._feed.close()
