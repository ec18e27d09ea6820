"""whittle's channel pruning side by side with Torch-Pruning (PyPI torch-pruning) on ResNet-20 and
ResNet-56 (the PyTorch definitions of zoo_models.py, option-B shortcuts), configured alike: L1
magnitude importance of every coupled weight (conv rows and columns, BN gamma, linear columns),
group importance reduced by the mean, no normalization, the same per-group ratio (0.5), no
rounding, the classifier left alone, no folding of removed channels' constants (Torch-Pruning has
none). Checks that both keep the same channels (every pruned tensor equal), the same parameter
count and MACs, and outputs within 1e-5 after loading the same weights; prints both tools' pruning
time.

Run by CTest with WHITTLE_BIN, WHITTLE_SOURCE_DIR and WHITTLE_BINARY_DIR set; skipped (exit 0 with a
note) when torch_pruning is not installed.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_harness import BIN, check, finish, out_dir  # noqa: E402
from make_zoo_reference import count_macs, randomize  # noqa: E402
from zoo_models import MODELS  # noqa: E402

try:
    import torch_pruning as tp
except ImportError:
    print("skipped: torch_pruning is not installed (pip install -r requirements.txt)")
    sys.exit(0)

OUT = out_dir("prune_torch_pruning")
shutil.rmtree(OUT, ignore_errors=True)  # nothing of an earlier run may stand in for this one's files
os.makedirs(OUT)
RATIO = 0.5


def read_checkpoint(path):
    """{(node, tensor name): numpy array} of a whittle checkpoint (docs/checkpoint-format.md)."""
    import h5py
    with h5py.File(path, "r") as f:
        index = json.loads(f["tensors/index"][()].tobytes())
        data = f["tensors/data"][()]
    out = {}
    for e in index:
        raw = data[e["offset"]: e["offset"] + e["nbytes"]]
        dtype = {"float32": np.float32, "int64": np.int64}[e["dtype"]]
        out[(e["node"], e["name"])] = np.frombuffer(raw.tobytes(), dtype=dtype).reshape(e["shape"])
    return out


for name in ["resnet20", "resnet56"]:
    build, shape = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    randomize(model, torch.Generator().manual_seed(0))
    x = torch.randn(4, *shape[1:], generator=torch.Generator().manual_seed(1))
    ts = os.path.join(OUT, f"{name}.pt")
    torch.jit.trace(model, torch.zeros(shape)).save(ts)

    # whittle: import the TorchScript file, prune, write a checkpoint.
    ck = os.path.join(OUT, f"{name}_pruned.h5")
    t0 = time.perf_counter()
    r = subprocess.run([BIN, "prune", ts, "--input-shape", ",".join(map(str, shape)), "--criterion", "l1",
                        "--sparsity", str(RATIO), "--group-reduction", "mean", "--no-fold-constant-outputs", "--out", ck],
                       capture_output=True, text=True)
    whittle_seconds = time.perf_counter() - t0
    check(r.returncode == 0, f"{name}: whittle prune exits 0" + ("" if r.returncode == 0 else ": " + r.stderr[-800:]))
    if r.returncode != 0:
        continue
    tensors = read_checkpoint(ck)

    # Torch-Pruning on a copy with the same weights.
    tp_model = build().eval()
    tp_model.load_state_dict(model.state_dict())
    imp = tp.importance.MagnitudeImportance(p=1, group_reduction="mean", normalizer=None)
    t0 = time.perf_counter()
    pruner = tp.pruner.MetaPruner(tp_model, torch.zeros(shape), importance=imp, pruning_ratio=RATIO,
                                  ignored_layers=[tp_model.linear], global_pruning=False, round_to=None)
    pruner.step()
    tp_seconds = time.perf_counter() - t0

    # The same channels kept: every pruned tensor equal.
    differ = []
    for mod_name, m in tp_model.named_modules():
        for pname, p in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
            if pname == "num_batches_tracked":
                continue
            key = (mod_name, pname)
            w = tensors.get(key)
            if w is None or w.shape != tuple(p.shape) or not np.allclose(w, p.detach().numpy(), atol=0, rtol=0):
                differ.append(f"{mod_name}.{pname} {tuple(p.shape)} vs {None if w is None else w.shape}")
    check(not differ, f"{name}: every pruned tensor equals Torch-Pruning's" + ("" if not differ else f" ({len(differ)} differ: {differ[:3]})"))

    tp_params = sum(p.numel() for p in tp_model.parameters())
    info = json.loads(subprocess.run([BIN, "inspect", ck, "--json"], capture_output=True, text=True).stdout)
    check(info["total"]["params"] == tp_params, f"{name}: parameters whittle {info['total']['params']} == Torch-Pruning {tp_params}")
    tp_macs = count_macs(tp_model, shape)[0]
    check(info["total"]["macs"] == tp_macs, f"{name}: MACs whittle {info['total']['macs']} == Torch-Pruning {tp_macs}")

    # Outputs: the whittle checkpoint's tensors loaded into the Torch-Pruning model's shapes.
    loaded = build().eval()
    with torch.no_grad():
        ref = tp_model(x)
        sd = {}
        for (node, tname), arr in tensors.items():
            sd[f"{node}.{tname}"] = torch.from_numpy(arr.copy())
        tp_sd = tp_model.state_dict()
        mine = {k: sd.get(k, v) for k, v in tp_sd.items()}
        tp_model.load_state_dict(mine)
        out = tp_model(x)
    diff = (out - ref).abs().max().item()
    check(diff <= 1e-5, f"{name}: outputs with whittle's tensors match Torch-Pruning's within 1e-5 (max |diff| {diff:.2e})")
    inner = [l for l in r.stdout.splitlines() if l.startswith("pruning time: ")]
    inner_s = float(inner[0].split()[2]) if inner else float("nan")
    print(f"{name}: pruning time whittle {inner_s:.3f} s (groups, scores, plan, removal; the whole command with "
          f"LibTorch start-up, import and checkpoint {whittle_seconds:.2f} s) vs Torch-Pruning {tp_seconds:.3f} s "
          f"(MetaPruner build + step)", flush=True)

finish()
