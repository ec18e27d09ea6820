"""The budget FP32 ResNet-20 trained from scratch in plain PyTorch, beside whittle's run of the same
recipe: is a gap in accuracy whittle's training or the data?

Reads recipes/cifar10/resnet20_budget.yaml (or --recipe) and trains the PyTorch ResNet-20 of
bench/micronet_cifar.py (tests/reference/zoo_models.py's layers, PyTorch's default
initialization) with what it says: SGD with momentum / Nesterov / weight decay, the learning-rate
schedule set every batch (runner/schedule.cpp's formulas, micronet_cifar.learning_rate), label
smoothing, batch size, normalization, random crop and flip, on the same images (whittle's packed HDF5 copy, data/cache/).
--epochs N shortens the schedule (it then spans N epochs), for a comparison with
  build/whittle run recipes/cifar10/resnet20_budget.yaml --set training.epochs=N --set outputs.dir=DIR
Exits, naming the key, on a recipe setting it does not mirror (micronet_cifar.UNMIRRORED, another
model, modifiers). Prints one line per epoch (test top-1 on the 10,000 test images, train top-1, seconds) and writes
metrics.jsonl in whittle's format to --out, so `whittle report` can show both. After each epoch it
saves its state (model, optimizer, data-order generator) to --out/train_state.pt; --resume carries
on after the last finished epoch, exactly as the uninterrupted run would (a run spans sittings).

usage: .venv/bin/python bench/fp32_reference.py [--recipe R] [--epochs N] [--threads T] [--out DIR] [--resume]
"""
import argparse
import json
import os
import sys
import time

import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import micronet_cifar as mc  # noqa: E402  (the model, data loading, evaluation and augmentation)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="recipes/cifar10/resnet20_budget.yaml")
    ap.add_argument("--epochs", type=int, help="epochs (default: the recipe's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/pytorch/resnet20_budget")
    ap.add_argument("--resume", action="store_true", help="carry on from --out/train_state.pt")
    args = ap.parse_args()
    os.chdir(mc.ROOT)
    recipe = yaml.safe_load(open(args.recipe))
    d, t = recipe["data"], recipe["training"]
    o, s = t["optimizer"], t.get("lr_schedule", {})
    mc.refuse_unmirrored(recipe, "fp32_reference.py")
    if o.get("name", "sgd") != "sgd":
        sys.exit("fp32_reference.py: mirrors SGD only")
    if recipe.get("model", {}).get("name") != "resnet20":
        sys.exit("fp32_reference.py: trains model resnet20 only")
    if recipe.get("modifiers"):
        sys.exit("fp32_reference.py: trains FP32 only; the recipe has modifiers")
    epochs = args.epochs or t["epochs"]
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    metrics = os.path.join(args.out, "metrics.jsonl")
    state_path = os.path.join(args.out, "train_state.pt")
    state = None
    if args.resume:
        if not os.path.exists(state_path):
            sys.exit(f"fp32_reference.py: --resume: no {state_path}")
        state = torch.load(state_path, weights_only=False)
        if state["recipe"] != recipe or state["epochs"] != epochs:
            sys.exit(f"fp32_reference.py: --resume: {state_path} is a run of another recipe or epoch count "
                     f"({state['epochs']} epochs)")
        done = state["epoch"]
        lines = open(metrics).read().splitlines()[:done] if os.path.exists(metrics) else []
        if len(lines) != done:
            sys.exit(f"fp32_reference.py: --resume: {metrics} holds {len(lines)} epochs, the state {done}")
        with open(metrics, "w") as f:
            f.write("".join(line + "\n" for line in lines))
    elif os.path.exists(metrics):
        os.remove(metrics)
    mean = torch.tensor(d["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(d["std"]).view(1, -1, 1, 1)
    xtr, ytr = mc.load_split(recipe, "train")
    xte, yte = mc.load_split(recipe, "test")
    torch.manual_seed(t.get("seed", 0))
    model = mc.ReLUResNet20(recipe["model"].get("num_classes", 10))
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o.get("momentum", 0.9),
                          nesterov=o.get("nesterov", False), weight_decay=o.get("weight_decay", 0.0))
    gen = torch.Generator().manual_seed(t.get("seed", 0))
    first = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        first = state["epoch"]
        print(f"resuming {args.out} after epoch {first}", flush=True)
    batch, pad = d["batch_size"], d.get("random_crop_padding", 0)
    steps = mc.steps_per_epoch(xtr.shape[0], d)
    for epoch in range(first, epochs):
        model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(xtr.shape[0], generator=gen)
        loss_sum, correct, seen = 0.0, 0, 0
        for i in range(steps):
            for g in opt.param_groups:
                g["lr"] = mc.learning_rate(s, o["lr"], epoch + i / steps, epochs)
            idx = perm[i * batch:(i + 1) * batch]
            xb = mc.augment(xtr[idx], pad, bool(d.get("horizontal_flip")), gen)
            loss, hits = mc.train_batch(model, opt, xb, ytr[idx], mean, std, t.get("label_smoothing", 0.0))
            loss_sum += loss * idx.numel()
            correct += hits
            seen += idx.numel()
        seconds = time.perf_counter() - t0
        top1, top5, test_loss = mc.evaluate(model, xte, yte, mean, std)
        line = {"epoch": epoch + 1, "train_loss": loss_sum / seen, "train_top1": correct / seen, "test_top1": top1,
                "test_top5": top5, "test_loss": test_loss, "lr": mc.learning_rate(s, o["lr"], epoch + 1 - 1e-9, epochs),
                "train_images_per_second": seen / seconds, "train_seconds": seconds}
        with open(metrics, "a") as f:
            f.write(json.dumps(line) + "\n")
        # Written whole, then renamed: an interrupted save leaves the previous state.
        torch.save({"recipe": recipe, "epochs": epochs, "epoch": epoch + 1, "model": model.state_dict(),
                    "optimizer": opt.state_dict(), "generator": gen.get_state()}, state_path + ".tmp")
        os.replace(state_path + ".tmp", state_path)
        print(f"epoch {epoch + 1}/{epochs}: test top-1 {100 * top1:.2f} %  train top-1 {100 * correct / seen:.2f} %  "
              f"({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
