"""resnet50_stand_in: ResNet-50 for the benchmarks that record what it saves, where torchvision will not import.

Owns: resnet50_stand_in(torch), the network torchvision.models.resnet50() builds (v1.5: the stride
on the 3x3 convolution of a bottleneck; one in-place ReLU module per block, reused; the downsample
branch run after the block's third convolution; the residual added in place), written from the
architecture, not copied; and torchvision_or_why(), the one test of whether torchvision's model
can be had beside this torch, which every benchmark that runs ResNet-50 asks.
Invariants: the same layers, shapes and forward order as torchvision's model, so autograd saves
the same tensors in the same order: tests/test_saved_activation_sizes.py checks what
saved_activation_sizes.py records from it against the 2026-11-26 run taken from torchvision's
model, and against torchvision's own wherever torchvision imports. Weights are whatever the
layers initialise to (the benchmark records shapes, on fake tensors).
"""

from __future__ import annotations

import sys
import types
from typing import Any


def import_torchvision() -> Any:
    """torchvision, or, where its compiled ops cannot load (a CUDA build of torchvision beside a CPU
    torch: "operator torchvision::nms does not exist"), torchvision without the fake-kernel
    registrations of those ops (detection ops; the model code is torchvision's own)."""
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    import torchvision
    return torchvision


def torchvision_or_why() -> tuple[Any, str]:
    """(torchvision, "") where it imports beside this torch, else (None, why not)."""
    try:
        return import_torchvision(), ""
    except Exception as e:  # not installed, or a build for another torch (ImportError, RuntimeError, OSError)
        return None, f"{type(e).__name__}: {e}".splitlines()[0]


def resnet50_stand_in(torch: Any) -> Any:
    """A fresh ResNet-50 (1000 classes) with torchvision.models.resnet50()'s layers and forward."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            out = planes * 4
            self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                               if stride != 1 or inplanes != out else None)

        def forward(self, x: Any) -> Any:
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            y += x if self.downsample is None else self.downsample(x)
            return self.relu(y)

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64)
            self.relu, self.maxpool = nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)
            stages, inplanes = [], 64
            for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                stage = []
                for i in range(blocks):
                    stage.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
                    inplanes = planes * 4
                stages.append(nn.Sequential(*stage))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.avgpool, self.fc = nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(2048, 1000)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet50()
