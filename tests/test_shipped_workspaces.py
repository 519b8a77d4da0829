"""The cuDNN workspace tables shipped in the package (workbench/capture/estimate/tables/): a table is taken
only for the GPU, torch and cuDNN its meta names, with cudnn.benchmark off, and it says it was shipped."""

from __future__ import annotations

import json

from workbench.analysis.memory.cudnn_model import CALIBRATION_FORMAT
from workbench.capture.estimate import convolution as conv

META = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "cudnn": 91900, "cudnn_benchmark": False}
KEY = "forward|x8x3x32x32|w16x3x3x3|y8x16x32x32|s1x1|p1x1|d1x1|t0|o0x0|g1|fp32|tf32|nchw"


def _write(folder, name, meta):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(json.dumps({"format": CALIBRATION_FORMAT, "meta": meta, "entries": {KEY: 1024}}))


def test_a_table_is_taken_only_for_its_gpu_torch_and_cudnn(tmp_path, monkeypatch):
    tables = tmp_path / "tables"
    _write(tables, "a_other.json", dict(META, device="NVIDIA A100-SXM4-80GB"))
    _write(tables, "b_bench.json", dict(META, cudnn_benchmark=True))
    _write(tables, "c_h200.json", META)
    (tables / "d_broken.json").write_text("{not json")
    monkeypatch.setattr(conv, "SHIPPED_TABLES", tables)
    conv._shipped_for.cache_clear()
    try:
        t = conv._shipped_for(("NVIDIA H200", "2.11.0+cu130", "91900"))
        assert t is not None and t.meta["shipped"] == "c_h200.json" and t.get(KEY) == 1024
        assert conv._shipped_for(("NVIDIA H200", "2.13.0+cu130", "91900")) is None   # another torch
        assert conv._shipped_for(("NVIDIA H100 80GB HBM3", "2.11.0+cu130", "91900")) is None
    finally:
        conv._shipped_for.cache_clear()


def test_without_a_gpu_no_table_is_taken():
    import torch

    if not torch.cuda.is_available():
        assert conv.shipped_table() is None


def test_the_shipped_tables_are_found_for_the_gpus_they_were_measured_on():
    # the real tables in the package: an H100 80GB HBM3 (corpus sample, example models, ResNet-50 at 224 px,
    # 2026-12-05) and the H200 (the CNN and U-Net families, 2026-12-04), both torch 2.11.0+cu130, cuDNN 9.19
    conv._shipped_for.cache_clear()
    try:
        names = sorted(p.name for p in conv.SHIPPED_TABLES.glob("*.json"))
        assert len(names) >= 2
        for device, size in (("NVIDIA H100 80GB HBM3", 2000), ("NVIDIA H200", 800)):
            t = conv._shipped_for((device, "2.11.0+cu130", "91900"))
            assert t is not None and t.meta["device"] == device and t.meta["shipped"] in names
            assert len(t) >= size
    finally:
        conv._shipped_for.cache_clear()
