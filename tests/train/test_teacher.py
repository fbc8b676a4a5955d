"""Distillation teachers from any framework: a timm CNN, an ONNX file, a ViT checkpoint; each
sees the student's batch in its own preparation, and the DeiT loss with it matches a hand
computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit import cli
from vitkit.data.data_config import DataConfig
from vitkit.train import TrainConfig
from vitkit.train.tasks import ClassificationTask, DistillForward
from vitkit.train.teacher import load_teacher

STUDENT = dict(student_mean=(0.3,), student_std=(0.2,), student_size=(8, 8))
TINY = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2"]


def _timm_resnet(tmp_path, classes: int = 10):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=classes).eval()
    path = tmp_path / f"resnet{classes}.pth"
    torch.save(model.state_dict(), path)
    return model, path


def test_a_timm_cnn_sees_the_batch_in_its_own_preparation(tmp_path):
    reference, weights = _timm_resnet(tmp_path)
    teacher = load_teacher("timm:test_resnet", weights=str(weights), **STUDENT)
    assert teacher.num_classes == 10
    assert teacher.data_config.input_size == (3, 160, 160)  # timm's data config of the model
    images = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    pixels = (images * 0.2 + 0.3).expand(-1, 3, -1, -1)  # grey student, RGB teacher
    pixels = F.interpolate(pixels, size=(160, 160), mode="bilinear", antialias=True)
    expected = reference((pixels - 0.5) / 0.5)  # test_resnet: mean = std = 0.5
    torch.testing.assert_close(teacher(images), expected, atol=1e-5, rtol=1e-5)
    teacher.train()
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_the_distillation_loss_with_a_cnn_teacher_is_deits(tmp_path):
    _, weights = _timm_resnet(tmp_path)
    teacher = load_teacher("timm:test_resnet", weights=str(weights), **STUDENT)
    torch.manual_seed(0)
    student = vitkit.create_model("vit_digits", embed_dim=16, depth=1, num_heads=2,
                                  distilled=True)  # fmt: skip
    images = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    labels = torch.arange(6) % 10
    targets = F.one_hot(labels, 10).float()
    for mode in ("hard", "soft"):
        config = TrainConfig(distill=mode, teacher="timm:test_resnet", distill_alpha=0.3,
                             distill_tau=2.0)  # fmt: skip
        task = ClassificationTask(student, config, teacher=teacher)
        loss, _ = task.loss(DistillForward(student), images, targets)
        cls_logits, dist_logits = student.forward_distill(images)
        teacher_logits = teacher(images)
        if mode == "hard":
            extra = F.cross_entropy(dist_logits, teacher_logits.argmax(-1))
        else:
            p = F.log_softmax(dist_logits / 2.0, -1)
            q = F.log_softmax(teacher_logits / 2.0, -1)
            extra = (q.exp() * (q - p)).sum(-1).mean() * 4.0
        expected = 0.7 * F.cross_entropy(cls_logits, labels) + 0.3 * extra
        torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_an_onnx_teacher(tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.export import export_onnx

    torch.manual_seed(0)
    model = vitkit.VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=1,
                                     num_heads=2, num_classes=10, in_chans=1).eval()  # fmt: skip
    model.data_config = DataConfig(input_size=(1, 16, 16), mean=0.5, std=0.25)
    export_onnx(model, tmp_path / "teacher.onnx")
    teacher = load_teacher(str(tmp_path / "teacher.onnx"), weights=None, **STUDENT)
    assert teacher.num_classes == 10 and teacher.data_config == model.data_config
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    pixels = F.interpolate(images * 0.2 + 0.3, size=(16, 16), mode="bicubic", antialias=True)
    with torch.no_grad():
        expected = model((pixels - 0.5) / 0.25)
    torch.testing.assert_close(teacher(images), expected, atol=1e-4, rtol=1e-4)


def test_distil_a_timm_cnn_into_a_vit_from_the_command_line(tmp_path, capsys):
    _, weights = _timm_resnet(tmp_path)
    argv = ["train", "--out", str(tmp_path / "run"), "--epochs", "1", *TINY, "--no-progress"]
    argv += ["--teacher", "timm:test_resnet", "--teacher-weights", str(weights)]
    assert cli.main([*argv, "--distill", "soft"]) == 0, capsys.readouterr().err
    assert vitkit.load(tmp_path / "run" / "model.safetensors").config.distilled
    _, five = _timm_resnet(tmp_path, classes=5)
    argv[2] = str(tmp_path / "run5")
    code = cli.main([*argv[:-1], str(five), "--distill", "hard"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "the teacher predicts 5 classes, the student 10" in err


@pytest.mark.parametrize(
    "spec, weights, message",
    [
        ("timm:no_such_model", None, "timm has no model 'no_such_model'"),
        ("missing.safetensors", None, "is neither a file nor timm:NAME / torchvision:NAME"),
        ("missing.onnx", None, "teacher missing.onnx does not exist"),
        ("missing.onnx", "w.pth", "--teacher-weights is for timm:NAME or torchvision:NAME"),
    ],
)
def test_teacher_mistakes_are_one_line(spec, weights, message):
    pytest.importorskip("timm")
    pytest.importorskip("onnxruntime")
    with pytest.raises(ValueError, match=message):
        load_teacher(spec, weights=weights, **STUDENT)


def test_a_torchvision_cnn_teacher(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    reference = torchvision.models.resnet18(num_classes=10).eval()
    torch.save(reference.state_dict(), tmp_path / "resnet18.pth")
    teacher = load_teacher("torchvision:resnet18", weights=str(tmp_path / "resnet18.pth"),
                           **STUDENT)  # fmt: skip
    assert teacher.num_classes == 10 and teacher.data_config.input_size == (3, 224, 224)
    images = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    pixels = (images * 0.2 + 0.3).expand(-1, 3, -1, -1)
    pixels = F.interpolate(pixels, size=(224, 224), mode="bilinear", antialias=True)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = reference((pixels - mean) / std)
    torch.testing.assert_close(teacher(images), expected, atol=1e-4, rtol=1e-4)


def test_distil_into_pretrained_weights_without_a_distillation_token(tmp_path, capsys):
    """`--pretrained` weights trained without a distillation token take `--distill`: the token
    is added (a copy of the class token) and the run saves a distilled model."""
    _, weights = _timm_resnet(tmp_path)
    source = vitkit.VisionTransformer(img_size=8, patch_size=2, in_chans=1, embed_dim=16,
                                      depth=1, num_heads=2, num_classes=10)  # fmt: skip
    vitkit.save(source, tmp_path / "source.safetensors")
    argv = ["train", "--out", str(tmp_path / "run"), "--epochs", "1", "--no-progress",
            "--pretrained", str(tmp_path / "source.safetensors"), "--distill", "hard",
            "--teacher", "timm:test_resnet", "--teacher-weights", str(weights)]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = vitkit.load(tmp_path / "run" / "model.safetensors")
    assert model.config.distilled and model.pos_embed.shape == (1, 2 + 16, 16)
