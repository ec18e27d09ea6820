"""CIFAR-10 ResNet-20 fine-tuning with micronet's own quantizers, beside whittle's budget recipes.

For one method, starts from the FP32 checkpoint whittle trained (runs/cifar10/resnet20_budget by
default), loads it into the PyTorch ResNet-20 of tests/reference/zoo_models.py (by way of
`whittle export` to TorchScript: the state_dict keys are the same), applies micronet 1.12.0's
`prepare`, and fine-tunes in a plain PyTorch loop with what whittle's recipe
recipes/cifar10/resnet20_budget_<method>.yaml says: epochs, batch size, optimizer (SGD with
momentum / Nesterov / weight decay, or Adam), the learning-rate schedule set every batch
(runner/schedule.cpp's formulas, `learning_rate`), label smoothing, normalization, random crop and
flip, seed (a recipe setting it does not mirror, UNMIRRORED, stops it with the key's name), on the same images (whittle's packed HDF5 copy of the JPEG archive,
data/cache/). Each epoch it evaluates on the 10,000 test images and saves its training state, so
--resume continues an interrupted run; at the end it saves the model as micronet's users do,
torch.save(model.state_dict()), and writes report.json and metrics.jsonl in whittle's run
directory format, so `whittle report` shows both sides together.
The loop and its checks are bench/peer_cifar_common.py's, shared with bench/brevitas_cifar.py.

micronet modules (what each quantizes, from micronet's source):
  dorefa_w{8,4,2}a{8,4,2}: micronet.compression.quantization.wqaq.dorefa.quantize.prepare(a_bits, w_bits):
      every conv and linear layer but the first, classifier included; activations
      round(clip(0.1·a, 0, 1)·(2^k − 1)) / (2^k − 1) at each quantized layer's input.
  twn:  micronet.compression.quantization.wbwtab.quantize.prepare(W=3, A=32): ternary weights in
      every conv but the first and the last registered (layer3.2.conv2); full-precision activations.
  bnn:  the same module with W=2, A=2: binary weights scaled by mean |W| (XNOR-Net style; micronet
      has one binary mode, the peer of whittle's BNN and XNOR-Net recipes, whose schedules are the
      same) and sign activations in place of the nn.ReLU modules, again sparing the first and the
      last conv. The linear classifier is never quantized.
Both sides keep the first conv in full precision; whittle quantizes layer3.2.conv2 and keeps the
classifier in full precision; micronet's DoReFa quantizes the classifier, its binary and ternary
modules keep layer3.2.conv2.

usage: .venv/bin/python bench/micronet_cifar.py METHOD [--fp32 RUN_DIR] [--out DIR] [--resume]
                                                [--threads 2] [--build build] [--seed N]
  METHOD: dorefa_w8a8, dorefa_w4a4, dorefa_w2a2, twn or bnn
Prints the FP32 checkpoint's top-1 as PyTorch computes it (a check of the loading: it must equal
whittle's), then one line per epoch, then top-1, top-5, training time and the saved file's bytes.
--fp32, --out and --build are relative to the current directory (the defaults, to the repository).
Exit status 2 on bad input (an argument, a run directory or training state that does not fit),
checked before anything is created; 1 when a later step fails.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The shared replay (peer_cifar_common.py); its helpers stay importable from here, as
# bench/fp32_reference.py, activation_clip_mse.py, train_compare.py and micronet_compare.py and
# tests/reference/results_doc_test.py read them.
import peer_cifar_common as common  # noqa: E402
from peer_cifar_common import (ROOT, UNMIRRORED, WEIGHT_DECAY, ReLUBlock, ReLUResNet20, augment,  # noqa: E402,F401
                               evaluate, fail, finite_or_none, learning_rate, load_fp32, load_split,
                               refuse_unmirrored, steps_per_epoch, train_batch, zoo_models)

METHODS = ("dorefa_w8a8", "dorefa_w4a4", "dorefa_w2a2", "twn", "bnn")


def prepare(model, method):
    if method.startswith("dorefa"):
        from micronet.compression.quantization.wqaq.dorefa import quantize as mq
        bits = int(method[len("dorefa_w")])
        return mq.prepare(model, inplace=True, a_bits=bits, w_bits=bits)
    from micronet.compression.quantization.wbwtab import quantize as mq
    if method == "twn":
        return mq.prepare(model, inplace=True, A=32, W=3)
    return mq.prepare(model, inplace=True, A=2, W=2)


class Micronet(common.Peer):
    script = "micronet_cifar.py"
    package = "micronet"
    description = __doc__.split("\n")[0]
    methods = METHODS
    out_help = "run directory (default runs/micronet/resnet20_budget_<method>)"

    def recipe_stem(self, method):
        return "resnet20_budget_" + ("dorefa_" + method[len("dorefa_"):] if method.startswith("dorefa") else method)

    def default_out(self, method, stem):
        return f"runs/micronet/{stem}"

    def prepare(self, model, method, recipe):
        return prepare(model, method)


def main():
    common.run(Micronet())


if __name__ == "__main__":
    main()
