"""What the CIFAR-10 ResNet-20 peer replays share (bench/micronet_cifar.py, bench/brevitas_cifar.py).

Each replay starts from the FP32 checkpoint whittle trained (runs/cifar10/resnet20_budget by
default), loaded into the PyTorch ResNet-20 of tests/reference/zoo_models.py by way of `whittle
export` to TorchScript (the state_dict keys are the same), checks that it gives whittle's top-1,
puts another toolkit's quantizers into it and fine-tunes it in a plain PyTorch loop with what
whittle's recipe recipes/cifar10/resnet20_budget_<method>.yaml says: epochs, batch size, optimizer
(SGD with momentum / Nesterov / weight decay, or Adam), the learning-rate schedule set every batch
(runner/schedule.cpp's formulas, `learning_rate`), label smoothing, normalization, random crop and
flip, seed (a recipe setting it does not mirror, UNMIRRORED, stops it with the key's name), on the
same images (whittle's packed HDF5 copy of the JPEG archive, data/cache/). Each epoch it evaluates
on the 10,000 test images and saves its training state, so --resume continues an interrupted run;
at the end it saves the model as the toolkit's users do, torch.save(model.state_dict()), and
writes report.json and metrics.jsonl in whittle's run directory format, so `whittle report` shows
both sides together.

A replay is a `Peer` (its toolkit, methods, default paths and quantizers) handed to `run`. The
helpers (the FP32 loader, the data reader, the schedule mirror, augmentation, evaluation) are also
read by bench/fp32_reference.py, activation_clip_mse.py, train_compare.py and micronet_compare.py,
through micronet_cifar.py, which re-exports them.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import zoo_models  # noqa: E402

# The prefix of the messages: the running script's file name (run() sets the peer's).
SCRIPT = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "peer_cifar_common.py"


class ReLUBlock(zoo_models.BasicBlock):
    """zoo_models.BasicBlock with its ReLUs as nn.ReLU modules (micronet's binary module replaces
    nn.ReLU modules; F.relu calls it cannot see). Same parameters and state_dict keys."""

    def __init__(self, cin, cout, stride):
        super().__init__(cin, cout, stride)
        self.relu1 = nn.ReLU()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


def ReLUResNet20(num_classes=10):
    """zoo_models.CifarResNet(3) with ReLUBlocks (nn.ReLU modules); same layers, order and keys."""
    return zoo_models.CifarResNet(3, num_classes, block=ReLUBlock)


def fail(message, status=2):
    """One line on stderr and the exit status: 2 for bad input, 1 for a failed step."""
    print(f"{SCRIPT}: {message}", file=sys.stderr)
    sys.exit(status)


def load_fp32(build, fp32_dir, tmp_dir):
    """The FP32 ResNet-20 of whittle run `fp32_dir`, via `whittle export` to TorchScript."""
    pt = os.path.join(tmp_dir, "fp32.pt")
    if not os.path.exists(pt):
        r = subprocess.run([os.path.join(build, "whittle"), "export", os.path.join(fp32_dir, "model.h5"), "--out", pt],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            fail(f"whittle export failed (exit status {r.returncode}): {r.stderr.strip() or 'no message'}", 1)
    sd = torch.jit.load(pt).state_dict()
    model = ReLUResNet20()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    return model


def load_split(recipe, split):
    """Images (uint8 N×3×32×32) and labels of whittle's packed copy of the recipe's dataset."""
    d = recipe["data"]
    src = d["train" if split == "train" else "test"]
    stem = os.path.basename(src)
    for ext in (".tar.gz", ".tgz", ".tar"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
    path = os.path.join(ROOT, d["pack_to"], f"{stem}-{d[split + '_split']}.h5")
    if not os.path.exists(path):
        sys.exit(f"{SCRIPT}: {path} is missing: whittle packs it on its first run of the recipe "
                 f"(or `build/whittle data pack {src} --to {path}`)")
    with h5py.File(path, "r") as f:
        return torch.from_numpy(np.asarray(f["images"])), torch.from_numpy(np.asarray(f["labels"]))


# Recipe settings that change the training math and that the PyTorch replays do not mirror:
# (section, key, the value that leaves it off; WEIGHT_DECAY: off when null or equal to the
# optimizer's weight_decay, as runner/recipe.cpp reads the exemptions).
WEIGHT_DECAY = object()
UNMIRRORED = (("training", "grad_accumulation", 1), ("training", "grad_clip_norm", 0), ("training", "amp", "none"),
              ("training.optimizer", "norm_weight_decay", WEIGHT_DECAY),
              ("training.optimizer", "bias_weight_decay", WEIGHT_DECAY),
              ("data", "train_limit", 0), ("data", "test_limit", 0))


def refuse_unmirrored(recipe, script):
    """Exits, naming the key, when the whittle recipe (a parsed YAML mapping) sets something in
    UNMIRRORED: the replay would silently differ from whittle's run."""
    for section, key, off in UNMIRRORED:
        node = recipe
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or key not in node:
            continue
        value = node[key]
        if off is WEIGHT_DECAY:
            if value is None or value == node.get("weight_decay", 0.0):
                continue
        elif value == off:
            continue
        sys.exit(f"{script}: {section}.{key} is not mirrored")


def steps_per_epoch(images, d):
    """Batches in an epoch of `images` training images under the recipe's data mapping `d`, as
    whittle's loader counts them: the last incomplete batch is dropped unless data.drop_last is false."""
    batch = d["batch_size"]
    return images // batch if d.get("drop_last", True) else -(-images // batch)


def learning_rate(s, base, e, total):
    """whittle's learning rate (runner/schedule.cpp's learning_rate_at) at fractional epoch `e` of
    `total`: schedule `s` (the recipe's lr_schedule mapping: constant, step, multistep, cosine or
    one_cycle, with optional linear warm-up) from the optimizer's `base` rate."""
    name = s.get("name", "constant")
    f = min(1.0, max(0.0, e / total))
    if name == "constant":
        rate = base
    elif name == "step":
        rate = base * s.get("gamma", 0.1) ** math.floor(e / s.get("step_size", 30))
    elif name == "multistep":
        rate = base * s.get("gamma", 0.1) ** sum(e >= m for m in s.get("milestones", []))
    elif name == "cosine":
        lo = s.get("min_lr", 0.0)
        rate = lo + (base - lo) * 0.5 * (1 + math.cos(math.pi * f))
    elif name == "one_cycle":
        peak = s.get("max_lr") or base
        start, end, pct = peak / 25.0, peak / 1e4, s.get("pct_start", 0.3)
        if f < pct:
            rate = peak + (start - peak) * 0.5 * (1 + math.cos(math.pi * f / pct))
        else:
            rate = end + (peak - end) * 0.5 * (1 + math.cos(math.pi * (f - pct) / max(1e-12, 1 - pct)))
    else:
        sys.exit(f"unknown lr_schedule '{name}'")
    w = s.get("warmup_epochs", 0)
    return rate * (e / w) if w and e < w else rate


def evaluate(model, x, y, mean, std):
    model.eval()
    correct1 = correct5 = 0
    loss = 0.0
    with torch.no_grad():
        for i in range(0, x.shape[0], 500):
            logits = model((x[i:i + 500].float() / 255 - mean) / std)
            yy = y[i:i + 500]
            loss += float(F.cross_entropy(logits, yy, reduction="sum"))
            top5 = logits.topk(5, 1).indices
            correct1 += int((top5[:, 0] == yy).sum())
            correct5 += int((top5 == yy[:, None]).any(1).sum())
    n = x.shape[0]
    return correct1 / n, correct5 / n, loss / n


def augment(xb, pad, flip_images, gen):
    """Random crop with `pad` zero pixels (when pad > 0) and, when `flip_images`, a random
    horizontal flip with probability 1/2, per image (uint8 N×C×H×W), as whittle's loader does."""
    n, _, h, w = xb.shape
    padded = F.pad(xb, (pad, pad, pad, pad)) if pad else xb
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    flip = (torch.rand(n, generator=gen) < 0.5) if flip_images else torch.zeros(n, dtype=torch.bool)
    out = torch.empty_like(xb)
    for i in range(n):
        img = padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
        out[i] = img.flip(2) if flip[i] else img
    return out


def train_batch(model, opt, xb, yb, mean, std, label_smoothing=0.0, loss_fn=None):
    """One SGD step on uint8 images `xb` (normalized here) and labels `yb`, cross-entropy with the
    recipe's label smoothing (the same form as whittle's: ε spread over all classes), or
    loss_fn(logits, normalized images, labels, label_smoothing) when given: (mean loss, correct
    predictions)."""
    x = (xb.float() / 255 - mean) / std
    logits = model(x)
    if loss_fn is None:
        loss = F.cross_entropy(logits, yb, label_smoothing=label_smoothing)
    else:
        loss = loss_fn(logits, x, yb, label_smoothing)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach()), int((logits.argmax(1) == yb).sum())


def finite_or_none(v):
    """NaN and infinities as JSON null (a diverged run stays readable by `whittle report`)."""
    return v if math.isfinite(v) else None


class Peer:
    """One toolkit's replay: what run() asks of it. Subclasses set the attributes and override the
    methods they need; the defaults are a plain cross-entropy fine-tune of every parameter."""

    script = ""       # the script's file name: the prefix of its messages
    package = ""      # the toolkit's PyPI distribution: checked installed, named in the report's "tool"
    description = ""  # the first line of --help
    methods = ()      # the METHOD choices
    out_help = ""     # --out's help
    smoke_option = False  # offer --max-batches N and --max-epochs N (testing only)

    def recipe_stem(self, method):
        """The whittle recipe the method mirrors: recipes/cifar10/<stem>.yaml."""
        raise NotImplementedError

    def default_out(self, method, stem):
        """The run directory without --out (relative to the repository)."""
        raise NotImplementedError

    def check_recipe(self, recipe, method, fp32):
        """Exits on what of the recipe it cannot mirror (modifiers: the method's quantizers, a
        teacher), before anything is created; `fp32` is the FP32 run directory. Default: nothing."""

    def prepare(self, model, method, recipe):
        """The model to fine-tune, from the FP32 `model` (which it may change in place)."""
        return model

    def parameters(self, model, optimizer):
        """What the optimizer updates (parameters or groups); `optimizer` is the recipe's mapping."""
        return model.parameters()

    def loss(self):
        """None for cross-entropy with the recipe's label smoothing, else a callable
        (logits, normalized images, labels, label_smoothing) → mean loss."""
        return None

    def initialize(self, model, batch):
        """Once, before the first step of a fresh run: `batch(i)` gives the normalized training
        images of step i of the first epoch (the ones it trains on). Default: nothing."""

    def report_extra(self):
        """Keys added to report.json."""
        return {}


def run(peer):
    """The replay's command line, checks, training loop and run directory (see the top of this file)."""
    global SCRIPT
    SCRIPT = peer.script
    ap = argparse.ArgumentParser(description=peer.description)
    ap.add_argument("method", choices=peer.methods)
    ap.add_argument("--fp32", help="whittle's FP32 run directory (default runs/cifar10/resnet20_budget)")
    ap.add_argument("--out", help=peer.out_help)
    ap.add_argument("--resume", action="store_true", help="continue from the run directory's training state")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", help="where the whittle program is (default build)")
    ap.add_argument("--seed", type=int, help="the run's seed in place of the recipe's training.seed (a replicate; "
                    "whittle's side: --set training.seed=N)")
    if peer.smoke_option:
        ap.add_argument("--max-batches", type=int, metavar="N",
                        help="for testing only: stop each epoch after N training batches and evaluate on "
                             "N·500 test images spread over the set (the report says so); not a result")
        ap.add_argument("--max-epochs", type=int, metavar="N",
                        help="for testing only: stop after N epochs (the schedule still spans the recipe's; the "
                             "report says so); not a result")
    args = ap.parse_args()
    # The testing options given (a smoke test's state and report record them).
    smoke = {k: getattr(args, k) for k in ("max_batches", "max_epochs") if getattr(args, k, None) is not None}
    max_batches = smoke.get("max_batches")
    # Argument checks first, before anything is created; the caller's paths resolved before the
    # move to the repository root (the defaults are the repository's).
    if args.threads < 1:
        fail(f"--threads {args.threads}: at least 1")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        fail(f"--seed {args.seed}: a seed is ≥ 0 and < 2^63 (as whittle's training.seed)")
    for key, value in smoke.items():
        if value < 1:
            fail(f"--{key.replace('_', '-')} {value}: at least 1")
    named = lambda option, value: f"{option} {value}: " if value else ""  # the option, when given
    fp32 = os.path.abspath(args.fp32) if args.fp32 else "runs/cifar10/resnet20_budget"
    build = os.path.abspath(args.build) if args.build else os.path.join(ROOT, "build")
    out = os.path.abspath(args.out) if args.out else None
    os.chdir(ROOT)
    whittle_name = peer.recipe_stem(args.method)
    out = out or peer.default_out(args.method, whittle_name)
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"{named('--out', args.out)}{out} is a file, not a run directory")
    state_path = os.path.join(out, "train_state.pt")
    if os.path.exists(os.path.join(out, "report.json")) and not args.resume:
        fail(f"{out} already holds a finished run (delete it to rerun)")
    if os.path.exists(state_path) and not args.resume:
        fail(f"{out} holds a training state: continue with --resume or delete the directory")
    if args.resume and not os.path.isfile(state_path):
        fail(f"--resume: no training state at {state_path}")
    exported = os.path.exists(os.path.join(out, "fp32.pt"))  # an earlier call's `whittle export`
    for name in ("report.json",) if exported else ("model.h5", "report.json"):
        if not os.path.isfile(os.path.join(fp32, name)):
            fail(f"{named('--fp32', args.fp32)}no {name} in {fp32} (a finished whittle run of "
                 "recipes/cifar10/resnet20_budget.yaml)")
    if not exported and not os.access(os.path.join(build, "whittle"), os.X_OK):
        fail(f"{named('--build', args.build)}no whittle program at {os.path.join(build, 'whittle')}")
    try:
        __import__(peer.package)
    except ImportError:
        sys.exit(f"{peer.script}: {peer.package} is not installed (it is in requirements.txt: scripts/setup.sh)")
    recipe_path = f"recipes/cifar10/{whittle_name}.yaml"
    recipe = yaml.safe_load(open(recipe_path))
    refuse_unmirrored(recipe, peer.script)
    peer.check_recipe(recipe, args.method, fp32)
    if args.seed is not None:
        recipe["training"]["seed"] = args.seed
    st = None  # the training state --resume carries on from
    if args.resume:
        try:
            st = torch.load(state_path, weights_only=False)
        except Exception as e:  # a truncated or foreign file: pickle, zip and OS errors alike
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            fail(f"--resume: {state_path} is not a readable training state ({reason})")
        keys = ("model", "optimizer", "generator", "cpu_rng", "epoch", "elapsed")
        missing = [k for k in keys if k not in st] if isinstance(st, dict) else list(keys)
        if missing:
            fail(f"--resume: {state_path} is not a training state of this script (no {', '.join(missing)})")
        saved_seed = st.get("seed", 0)
        if saved_seed != recipe["training"].get("seed", 0):
            fail(f"--resume: {state_path} is a run of seed {saved_seed}, not "
                 f"{recipe['training'].get('seed', 0)}: pass --seed {saved_seed}")
        if st.get("smoke", {}) != smoke:  # a smoke test's state goes on only as the same one
            said = lambda o: " ".join(f"--{k.replace('_', '-')} {v}" for k, v in o.items()) or "no testing options"
            fail(f"--resume: {state_path} is a run with {said(st.get('smoke', {}))}, not {said(smoke)}")
    d, t = recipe["data"], recipe["training"]
    xtr, ytr = load_split(recipe, "train")
    xte, yte = load_split(recipe, "test")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create {out}: {e.strerror}")
    torch.set_num_threads(args.threads)
    o = t["optimizer"]
    mean = torch.tensor(d["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(d["std"]).view(1, -1, 1, 1)

    torch.manual_seed(t.get("seed", 0))
    model = load_fp32(build, fp32, out)
    fp32_report = json.load(open(os.path.join(fp32, "report.json")))
    top1, _, _ = evaluate(model, xte, yte, mean, std)
    print(f"FP32 checkpoint in PyTorch: top-1 {100 * top1:.2f} % (whittle: {100 * fp32_report['test_top1']:.2f} %)",
          flush=True)
    if abs(top1 - fp32_report["test_top1"]) > 1.5 / xte.shape[0]:  # one image's worth of float noise
        sys.exit(f"{peer.script}: the FP32 checkpoint does not load into the PyTorch ResNet-20 as whittle runs it")
    model = peer.prepare(model, args.method, recipe)
    params = peer.parameters(model, o)
    if o["name"] == "sgd":
        opt = torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.9),
                              nesterov=o.get("nesterov", False), weight_decay=o.get("weight_decay", 0.0))
    elif o["name"] == "adam":
        opt = torch.optim.Adam(params, lr=o["lr"], betas=(o.get("beta1", 0.9), o.get("beta2", 0.999)),
                               eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.0))
    else:
        sys.exit(f"{peer.script}: optimizer {o['name']} is not mirrored")
    gen = torch.Generator().manual_seed(t.get("seed", 0))
    start, elapsed = 0, 0.0
    if st is not None:
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        gen.set_state(st["generator"])
        torch.set_rng_state(st["cpu_rng"])
        start, elapsed = st["epoch"], st["elapsed"]
        print(f"resuming {out} at epoch {start + 1}", flush=True)
    elif os.path.exists(os.path.join(out, "metrics.jsonl")):
        os.remove(os.path.join(out, "metrics.jsonl"))

    batch, epochs, pad = d["batch_size"], t["epochs"], d.get("random_crop_padding", 0)
    flip = bool(d.get("horizontal_flip"))
    schedule = t.get("lr_schedule", {})
    steps = steps_per_epoch(xtr.shape[0], d)
    loss_fn = peer.loss()
    if max_batches is not None:  # a smoke test: N·500 test images evenly spread (the packed set is class-sorted)
        n = min(xte.shape[0], 500 * max_batches)
        pick = torch.arange(n) * xte.shape[0] // n
        xte, yte = xte[pick], yte[pick]
    for epoch in range(start, min(epochs, smoke.get("max_epochs", epochs))):
        model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(xtr.shape[0], generator=gen)
        drawn, next_draw = {}, [0]  # steps drawn (augmented, from `gen` in step order) and not yet trained on

        def images(i, keep=False):
            while next_draw[0] <= i:
                j = next_draw[0]
                xb = xtr[perm[j * batch:(j + 1) * batch]]
                drawn[j] = augment(xb, pad, flip, gen) if pad or flip else xb
                next_draw[0] += 1
            return drawn[i] if keep else drawn.pop(i)

        if epoch == 0 and st is None:  # a fresh run: the quantizers start from its first batches
            peer.initialize(model, lambda i: (images(i % steps, keep=True).float() / 255 - mean) / std)
            model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        for i in range(steps if max_batches is None else min(steps, max_batches)):
            for g in opt.param_groups:
                g["lr"] = learning_rate(schedule, o["lr"], epoch + i / steps, epochs)
            idx = perm[i * batch:(i + 1) * batch]
            xb = images(i)
            loss, hits = train_batch(model, opt, xb, ytr[idx], mean, std, t.get("label_smoothing", 0.0), loss_fn)
            loss_sum += loss * idx.numel()
            correct += hits
            seen += idx.numel()
        train_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        top1, top5, test_loss = evaluate(model, xte, yte, mean, std)
        eval_seconds = time.perf_counter() - t1
        elapsed += train_seconds + eval_seconds
        line = {"epoch": epoch + 1, "train_loss": finite_or_none(loss_sum / seen), "train_top1": correct / seen,
                "test_top1": top1, "test_top5": top5, "test_loss": finite_or_none(test_loss), "lr": learning_rate(schedule, o["lr"], epoch + 1 - 1e-9, epochs),
                "train_images_per_second": seen / train_seconds, "train_images": seen,
                "train_seconds": train_seconds, "eval_seconds": eval_seconds}
        with open(os.path.join(out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(line, allow_nan=False) + "\n")
        tmp = state_path + ".tmp"
        saved = {"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                 "cpu_rng": torch.get_rng_state(), "epoch": epoch + 1, "elapsed": elapsed, "seed": t.get("seed", 0)}
        if smoke:
            saved["smoke"] = smoke
        torch.save(saved, tmp)
        os.replace(tmp, state_path)
        print(f"epoch {epoch + 1}/{epochs}: test top-1 {100 * top1:.2f} %  top-5 {100 * top5:.2f} %  "
              f"loss {test_loss:.4f}  ({train_seconds + eval_seconds:.0f} s)", flush=True)

    ckpt = os.path.join(out, "model.pth")
    torch.save(model.state_dict(), ckpt)
    top1, top5, test_loss = evaluate(model, xte, yte, mean, std)
    from importlib.metadata import version
    report = {
        "recipe": recipe_path, "model": "resnet20", "tool": f"{peer.package} {version(peer.package)}",
        "test_top1": top1, "test_top5": top5, "test_loss": finite_or_none(test_loss), "test_images": int(xte.shape[0]),
        "epochs": epochs, "params": sum(p.numel() for p in model.parameters()),
        "macs_per_image": fp32_report["macs_per_image"],
        # Relative to the repository root when inside it, as in the committed summaries.
        "checkpoint": os.path.relpath(ckpt, ROOT) if ckpt.startswith(ROOT + os.sep) else ckpt,
        "checkpoint_bytes": os.path.getsize(ckpt), "wall_seconds": elapsed, "device": "cpu",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "intra_op_threads": torch.get_num_threads(),
        "seed": t.get("seed", 0), "torch_version": torch.__version__,
    }
    report.update(peer.report_extra())
    if smoke:
        report["smoke_test"] = smoke  # not a result
    with open(os.path.join(out, "recipe.yaml"), "w") as f:
        if args.seed is None:
            f.write(open(recipe_path).read())
        else:  # the recipe as run: its seed replaced
            f.write(f"# {recipe_path} with --seed {args.seed}\n")
            yaml.safe_dump(recipe, f, sort_keys=False)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2, allow_nan=False)
    os.remove(state_path)
    print(f"{peer.package} {args.method}: top-1 {100 * top1:.2f} %, top-5 {100 * top5:.2f} %, "
          f"{elapsed / 60:.1f} min, {os.path.getsize(ckpt):,} B ({ckpt})")
