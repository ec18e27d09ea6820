"""CIFAR-10 ResNet-20 fine-tuning with Brevitas's learned-scale quantizers, beside whittle's LSQ budget recipes.

For one method, starts from the FP32 checkpoint whittle trained (runs/cifar10/resnet20_budget by
default), loaded into the PyTorch ResNet-20 of tests/reference/zoo_models.py (by way of `whittle
export` to TorchScript), rebuilds it with Brevitas 0.13.4's QuantConv2d, QuantReLU and
QuantIdentity and fine-tunes it in a plain PyTorch loop with what whittle's recipe says (epochs,
batch size, optimizer, the learning-rate schedule set every batch, label smoothing, normalization,
random crop and flip, seed, and its `quantize` and `distill` modifiers), on the same images; the
loop, its checks, --resume and the run directory are bench/peer_cifar_common.py's, as for
bench/micronet_cifar.py.

  lsq_w4a4: recipes/cifar10/resnet20_budget_lsq_w4a4.yaml (5 epochs; steps from the paper's rule)
  lsq_w4a4_kd: recipes/cifar10/resnet20_budget_lsq_w4a4_kd.yaml (5 epochs, KD; steps from the MSE calibrator)
  lsq_w3a3: recipes/cifar10/resnet20_budget_lsq_w3a3_kd.yaml (5 epochs, KD; steps from the MSE calibrator)
  lsq_w2a2: recipes/cifar10/resnet20_budget_lsq_w2a2_kd.yaml (10 epochs, KD; steps from the MSE calibrator)

Quantizers, placed where whittle's quantize pass puts LSQ's (runs/.../report.json model_summary):
every conv but the first (the 18 block convs and the 2 shortcut convs) is a QuantConv2d with
signed weights on [−2^(b−1), 2^(b−1) − 1] (IntQuant, narrow_range False) and one learned scale per
output channel (ScalingImplType.PARAMETER, RestrictValueType.FP, ScalingPerOutputType.CHANNEL, or
TENSOR for granularity per_tensor); each quantized conv's input is on the unsigned grid
[0, 2^b − 1] with one learned scale (UintQuant, PARAMETER, per tensor): a QuantReLU in place of a
block's first ReLU (it feeds conv2 alone, whittle's relu = 1 quantizer), a QuantIdentity at the
block input (whittle's act_quant node before conv1; in the two downsampling blocks it is shared
with the 1×1 shortcut conv, as whittle's quantizer in place of the previous block's last ReLU is).
The first conv and the classifier stay in float; the residual additions read the float input.

What is mirrored from whittle's LSQ (quantize/lsq.cpp) and what is Brevitas's own:
  - Initial steps: as the recipe's step_init says, computed here and written into Brevitas's
    learned parameters (Brevitas's PARAMETER scaling starts from a constant): "paper" (the default)
    2·mean|x|/√Q_P, per output channel of the FP32 weights and over the layer input of the first
    training batch (the input whittle's quantizer node reads: where it replaced a ReLU, the ReLU's
    input: a QuantReLU's, and the previous block's last ReLU's for a downsampling block);
    "mse" whittle's MSE calibrator (quantize/calibrator_mse.cpp: 2048-bin histogram, 256 coarse
    and 64 fine candidate steps), per output channel of the weights and over the layer inputs of
    the first init_batches training batches (BN in training mode, its running statistics kept,
    activations passed on unquantized), as quantize::calibrate_learned.
  - The learned parameter: Brevitas learns the threshold T = s·Q (Q = 2^(b−1) for the weights,
    2^b − 1 for the activations; scale = |T|/Q, at least 1e-8 by a straight-through clamp), whittle
    the step s itself, clamped to 1e-8 after each step. With SGD this scales the step's update by
    1/Q² where LSQ's gradient scale (not in Brevitas, not added here) is 1/√(N·Q_P) (N: a channel's
    weights, a sample's activations).
  - Rounding: both torch.round (half to even), but Brevitas rounds then clamps, so its
    straight-through gradient passes up to half a step beyond the grid's ends (whittle's stops at
    them) and there the scale's gradient is round(v) − v, not the end's code.
  - No weight decay on the scales (the recipe's optimizer decays every other parameter).
  - distill (kd): loss = α·T²·KL(p_teacher ‖ p_student at T), batch mean, + (1 − α)·cross-entropy
    (with the recipe's label smoothing), the FP32 model loaded above as the frozen eval-mode teacher
    (the recipe's teacher must be --fp32's model.h5).

usage: .venv/bin/python bench/brevitas_cifar.py METHOD [--fp32 RUN_DIR] [--out DIR] [--resume]
                                                [--threads 2] [--build build] [--seed N]
                                                [--max-batches N] [--max-epochs N]
  METHOD: lsq_w4a4, lsq_w4a4_kd, lsq_w3a3 or lsq_w2a2; the run directory is runs/cifar10/brevitas_<METHOD> by default.
  --max-batches and --max-epochs are for testing only: N training batches an epoch and N·500 test
  images spread over the set, the first N epochs (report.json records them as smoke_test).
Prints the FP32 checkpoint's top-1 as PyTorch computes it (a check of the loading: it must equal
whittle's), the quantizers' initialization, one line per epoch, then top-1, top-5, training time
and the saved file's bytes. --fp32, --out and --build are relative to the current directory (the
defaults, to the repository). Exit status 2 on bad input (an argument, a run directory or training
state that does not fit), checked before anything is created; 1 when a later step fails or the
recipe asks for something not mirrored.
"""
import logging
import math
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_cifar_common as common  # noqa: E402

SCRIPT = "brevitas_cifar.py"
# Importing Brevitas imports torch.utils.cpp_extension, which logs a line on a machine without CUDA.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
# METHOD → the whittle recipe it mirrors (recipes/cifar10/<stem>.yaml).
RECIPES = {"lsq_w4a4": "resnet20_budget_lsq_w4a4", "lsq_w4a4_kd": "resnet20_budget_lsq_w4a4_kd",
           "lsq_w3a3": "resnet20_budget_lsq_w3a3_kd",
           "lsq_w2a2": "resnet20_budget_lsq_w2a2_kd"}
STEP_FLOOR = 1e-8  # whittle's lsq_step_floor for float32
# The modifier keys mirrored (any other key stops the script, naming it).
QUANTIZE_KEYS = {"name", "method", "weight_bits", "activation_bits", "granularity", "step_init", "init_batches"}
DISTILL_KEYS = {"name", "teacher", "method", "temperature", "alpha"}


def unmirrored(what):
    sys.exit(f"{SCRIPT}: {what} is not mirrored")


# ---- whittle's MSE calibrator (quantize/calibrate.cpp, calibrator_mse.cpp) -------------------------

KBINS = 2048
KHALF = KBINS // 2


class Histogram:
    """quantize::Histogram: counts of the non-zero values over [−r, r) in KBINS bins, r the smallest
    power of two above every |x| seen (doubling as needed, bins merged exactly), zeros apart."""

    def __init__(self):
        self.range, self.counts, self.zeros, self.count = 0.0, None, 0, 0
        self.min, self.max = math.inf, -math.inf

    def _grow(self, r):
        k, rr = 0, self.range
        while rr < r:
            rr *= 2.0
            k += 1
        if k == 0:
            return
        i = np.arange(KBINS, dtype=np.int64)
        j = (i + KHALF * ((1 << k) - 1)) >> k if k <= 11 else np.where(i < KHALF, KHALF - 1, KHALF)
        counts = np.zeros(KBINS, dtype=np.int64)
        np.add.at(counts, j, self.counts)
        self.counts, self.range = counts, r

    def observe(self, x):
        x = x.detach().reshape(-1).float().double()  # binned as float32, in double
        if x.numel() == 0:
            return
        if not bool(torch.isfinite(x).all()):
            common.fail("calibration input: a NaN or infinite value", 1)
        nonzero = x[x != 0]
        if nonzero.numel():
            _, e = math.frexp(float(nonzero.abs().max()))
            r = max(self.range, math.ldexp(1.0, e))
            index = ((nonzero + r) * (KBINS / (2.0 * r))).floor().clamp(0, KBINS - 1).long()
            add = torch.bincount(index, minlength=KBINS).numpy().astype(np.int64)
            if self.range == 0.0:
                self.range, self.counts = r, np.zeros(KBINS, dtype=np.int64)
            else:
                self._grow(r)
            self.counts += add
        self.zeros += x.numel() - nonzero.numel()
        self.count += x.numel()
        self.min, self.max = min(self.min, float(x.min())), max(self.max, float(x.max()))


def mse_step(h, q_n, q_p):
    """The MSE calibrator's step for the grid s·c, c integral in [−q_n, q_p]: the least squared
    quantization error over the histogram, 256 candidates up to the step covering [min, max], then
    64 between the best one's neighbours (ties to the larger step)."""
    if h.count == 0 or h.range == 0.0:
        return 1.0
    s_max = 0.0
    if q_p > 0:
        s_max = max(s_max, h.max / q_p)
    if q_n > 0:
        s_max = max(s_max, -h.min / q_n)
    if not (s_max > 0 and math.isfinite(s_max)):
        s_max = 1.0
    width = 2.0 * h.range / KBINS
    occupied = np.nonzero(h.counts)[0]
    x = np.concatenate([[0.0] if h.zeros else [], -h.range + (occupied + 0.5) * width])
    n = np.concatenate([[float(h.zeros)] if h.zeros else [], h.counts[occupied].astype(np.float64)])

    def search(lo, hi, k):
        s = lo + (hi - lo) * np.arange(1, k + 1) / k
        c = np.clip(np.rint(x[None, :] / s[:, None]), -q_n, q_p)
        err = ((x[None, :] - c * s[:, None]) ** 2 * n[None, :]).sum(1)
        return float(s[len(err) - 1 - np.argmin(err[::-1])])  # the last of the least

    coarse = search(0.0, s_max, 256)
    fine = search(max(coarse - s_max / 256, 0.0), coarse + s_max / 256, 64)
    return fine if fine > 0.0 else s_max


def histogram_of(x):
    h = Histogram()
    h.observe(x)
    return h


# ---- the Brevitas model ---------------------------------------------------------------------------

def quantizers():
    """Brevitas injectors for whittle's LSQ grids with learned scales (bit widths given per layer)."""
    from brevitas.inject.enum import RestrictValueType, ScalingImplType, ScalingPerOutputType
    from brevitas.quant.base import IntQuant, UintQuant
    from brevitas.quant.solver import ActQuantSolver, WeightQuantSolver

    class LearnedScaleWeight(IntQuant, WeightQuantSolver):  # signed, narrow_range False: [−2^(b−1), 2^(b−1) − 1]
        scaling_impl_type = ScalingImplType.PARAMETER
        scaling_per_output_type = ScalingPerOutputType.CHANNEL
        restrict_scaling_type = RestrictValueType.FP
        scaling_init = 1.0  # replaced by initial steps below
        scaling_min_val = STEP_FLOOR
        bit_width = 8

    class LearnedScaleWeightPerTensor(LearnedScaleWeight):
        scaling_per_output_type = ScalingPerOutputType.TENSOR

    class LearnedScaleAct(UintQuant, ActQuantSolver):  # [0, 2^b − 1]
        scaling_impl_type = ScalingImplType.PARAMETER
        scaling_per_output_type = ScalingPerOutputType.TENSOR
        restrict_scaling_type = RestrictValueType.FP
        scaling_init = 1.0
        scaling_min_val = STEP_FLOOR
        bit_width = 8

    return LearnedScaleWeight, LearnedScaleWeightPerTensor, LearnedScaleAct


class QuantBlock(nn.Module):
    """ReLUBlock with Brevitas layers: the block input quantized once (act_in) for conv1 and the
    shortcut conv, relu1 a QuantReLU; bn, the addition and relu2 in float. Same keys as ReLUBlock
    for every float parameter and buffer."""

    def __init__(self, cin, cout, stride, wq, aq, wb, ab):
        super().__init__()
        import brevitas.nn as qnn
        conv = lambda i, o, k, s, p: qnn.QuantConv2d(i, o, k, stride=s, padding=p, bias=False,
                                                     weight_quant=wq, weight_bit_width=wb)
        self.act_in = qnn.QuantIdentity(act_quant=aq, bit_width=ab)
        self.conv1 = conv(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = qnn.QuantReLU(act_quant=aq, bit_width=ab)
        self.conv2 = conv(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(conv(cin, cout, 1, stride, 0), nn.BatchNorm2d(cout))
        self.relu2 = nn.ReLU()

    def forward(self, x):
        q = self.act_in(x)
        out = self.relu1(self.bn1(self.conv1(q)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + (self.shortcut(q) if len(self.shortcut) else x))


class BrevitasResNet20(common.zoo_models.CifarResNet):
    """ReLUResNet20 with QuantBlocks: conv1, bn1 and the classifier in float."""

    def __init__(self, weight_bits, act_bits, per_channel=True, num_classes=10):
        w_channel, w_tensor, aq = quantizers()
        wq = w_channel if per_channel else w_tensor
        super().__init__(3, num_classes,
                         block=lambda cin, cout, stride: QuantBlock(cin, cout, stride, wq, aq, weight_bits, act_bits))

    def quant_convs(self):
        import brevitas.nn as qnn
        return [(n, m) for n, m in self.named_modules() if isinstance(m, qnn.QuantConv2d)]

    def act_quants(self):
        """(name, module, relu) of every activation quantizer, in forward order. relu: where whittle's
        quantizer node replaced a ReLU, that ReLU (the node reads its input): the QuantReLU itself,
        and for a downsampling block's input quantizer the previous block's relu2 (whittle's
        quantizer shared by conv1 and the shortcut conv); None where the node reads a ReLU's output."""
        import brevitas.nn as qnn
        out, previous = [], None
        for l, layer in enumerate((self.layer1, self.layer2, self.layer3)):
            for i, block in enumerate(layer):
                out.append((f"layer{l + 1}.{i}.act_in", block.act_in, previous.relu2 if len(block.shortcut) else None))
                out.append((f"layer{l + 1}.{i}.relu1", block.relu1, block.relu1))
                previous = block
        assert len(out) == sum(isinstance(m, (qnn.QuantIdentity, qnn.QuantReLU)) for m in self.modules())
        return out


def scale_parameter(module):
    """The learned threshold T of a Brevitas quant layer's one quantizer (scale = |T|/Q)."""
    from brevitas.core.scaling.standalone import ParameterScaling
    found = [m.value for m in module.modules() if isinstance(m, ParameterScaling)]
    assert len(found) == 1, f"{len(found)} learned scales in {type(module).__name__}"
    return found[0]


def set_step(module, step, q):
    """Writes step s (a float or a tensor of one per output channel) as Brevitas's threshold s·q."""
    p = scale_parameter(module)
    with torch.no_grad():
        p.copy_((torch.as_tensor(step, dtype=p.dtype) * q).reshape(p.shape))


def signed_grid(bits):
    return 1 << (bits - 1), (1 << (bits - 1)) - 1  # q_n, q_p


def unsigned_grid(bits):
    return 0, (1 << bits) - 1


class Brevitas(common.Peer):
    script = SCRIPT
    package = "brevitas"
    description = __doc__.split("\n")[0]
    methods = tuple(RECIPES)
    out_help = "run directory (default runs/cifar10/brevitas_<method>)"
    smoke_option = True

    def recipe_stem(self, method):
        return RECIPES[method]

    def default_out(self, method, stem):
        return f"runs/cifar10/brevitas_{method}"

    def check_recipe(self, recipe, method, fp32):
        """The recipe's modifiers: one lsq quantize entry with the method's bits, at most one kd
        distill entry whose teacher is the --fp32 checkpoint."""
        mods = recipe.get("modifiers") or []
        quant = [m for m in mods if m.get("name") == "quantize"]
        distill = [m for m in mods if m.get("name") == "distill"]
        for m in mods:
            if m.get("name") not in ("quantize", "distill"):
                unmirrored(f"modifier '{m.get('name')}'")
        if len(quant) != 1 or len(distill) > 1:
            unmirrored(f"{len(quant)} quantize and {len(distill)} distill modifiers")
        q = quant[0]
        for key in sorted(set(q) - QUANTIZE_KEYS):
            unmirrored(f"modifier 'quantize' key '{key}'")
        bits = int(method[len("lsq_w")]), int(method[len("lsq_wXa")])
        if q.get("method") != "lsq":
            unmirrored(f"quantize method '{q.get('method')}'")
        if (q.get("weight_bits", 4), q.get("activation_bits", 4)) != bits:
            sys.exit(f"{SCRIPT}: {RECIPES[method]}.yaml quantizes W{q.get('weight_bits', 4)}A"
                     f"{q.get('activation_bits', 4)}, not the W{bits[0]}A{bits[1]} of {method}")
        if q.get("granularity", "per_tensor") not in ("per_tensor", "per_channel"):
            unmirrored(f"granularity '{q.get('granularity')}'")
        self.step_init = q.get("step_init", "paper")
        if self.step_init not in ("paper", "mse"):
            unmirrored(f"step_init '{self.step_init}'")
        self.init_batches = int(q.get("init_batches", 1))
        if self.step_init == "paper" and self.init_batches != 1:
            sys.exit(f"{SCRIPT}: init_batches {self.init_batches} needs a step_init calibrator (as whittle says)")
        self.bits = bits
        self.per_channel = q.get("granularity", "per_tensor") == "per_channel"
        self.kd = None
        if distill:
            m = distill[0]
            for key in sorted(set(m) - DISTILL_KEYS):
                unmirrored(f"modifier 'distill' key '{key}'")
            kinds = m.get("method")
            if (kinds if isinstance(kinds, list) else [kinds]) != ["kd"]:
                unmirrored(f"distill method {kinds}")
            teacher = m.get("teacher", "")
            start = os.path.join(fp32, "model.h5")
            same = (os.path.samefile(teacher, start) if os.path.exists(teacher) and os.path.exists(start)
                    else os.path.abspath(teacher) == os.path.abspath(start))
            if not same:
                common.fail(f"the recipe's distill teacher {teacher} is not the --fp32 checkpoint "
                            f"{os.path.join(fp32, 'model.h5')} (this script's teacher is the model it starts from)")
            self.kd = (float(m.get("temperature", 4.0)), float(m.get("alpha", 0.9)))

    def prepare(self, model, method, recipe):
        warnings.filterwarnings("ignore", message="Named tensors")  # a Brevitas internal's, once per run
        wb, ab = self.bits
        student = BrevitasResNet20(wb, ab, self.per_channel)
        missing, unexpected = student.load_state_dict(model.state_dict(), strict=False)
        assert not unexpected and all("scaling_impl" in k for k in missing), (missing, unexpected)
        q_n, q_p = signed_grid(wb)
        with torch.no_grad():
            for name, conv in student.quant_convs():
                w = conv.weight.detach().float()
                rows = w.reshape(w.shape[0], -1) if self.per_channel else w.reshape(1, -1)
                if self.step_init == "paper":
                    step = (rows.abs().mean(1) * (2.0 / math.sqrt(q_p))).clamp_min(STEP_FLOOR)
                else:
                    step = torch.tensor([max(mse_step(histogram_of(r), q_n, q_p), STEP_FLOOR) for r in rows])
                set_step(conv, step, q_n)  # Brevitas's signed threshold: 2^(b−1)
                got = conv.quant_weight().scale.detach().reshape(-1)
                assert torch.allclose(got, step, rtol=1e-6, atol=0), (name, got, step)
        if self.kd:
            self.teacher = model.eval()
            for p in self.teacher.parameters():
                p.requires_grad_(False)
        self.student = student
        print(f"brevitas: {len(student.quant_convs())} QuantConv2d W{wb} "
              f"({'per channel' if self.per_channel else 'per tensor'}), {len(student.act_quants())} activation "
              f"quantizers A{ab}, weight steps from {self.step_init}"
              + (f"; KD from the FP32 model, T {self.kd[0]:g}, alpha {self.kd[1]:g}" if self.kd else ""), flush=True)
        return student

    def parameters(self, model, optimizer):
        steps = [p for n, p in model.named_parameters() if "scaling_impl" in n]
        rest = [p for n, p in model.named_parameters() if "scaling_impl" not in n]
        return [{"params": rest}, {"params": steps, "weight_decay": 0.0}]

    def loss(self):
        if not self.kd:
            return None
        temperature, alpha = self.kd
        teacher = self.teacher

        def kd_loss(logits, x, y, label_smoothing):
            with torch.no_grad():
                t_logits = teacher(x)
            kl = F.kl_div(F.log_softmax(logits / temperature, 1), F.log_softmax(t_logits / temperature, 1),
                          reduction="batchmean", log_target=True)
            hard = F.cross_entropy(logits, y, label_smoothing=label_smoothing)
            return alpha * temperature * temperature * kl + (1 - alpha) * hard

        return kd_loss

    def initialize(self, model, batch):
        """The activation steps from the first training batch(es), as whittle's quantize modifier
        does at its first step: the paper's rule from the first batch (each quantizer set from its
        input, then quantizing with it), or the MSE calibrator over init_batches batches (every
        activation quantizer passing on its input after the ReLU it stands for, unquantized)."""
        _, q_p = unsigned_grid(self.bits[1])
        quants = model.act_quants()
        buffers = [(b, b.detach().clone()) for b in model.buffers()]  # BN statistics, kept
        hooks = []
        try:
            if self.step_init == "paper":
                # whittle's rule reads what the layer reads: after the ReLU its node stands for.
                def init(relu):
                    def hook(module, inputs):
                        x = F.relu(inputs[0].detach()) if relu is not None else inputs[0].detach()
                        set_step(module, max(float(x.abs().float().mean()) * (2.0 / math.sqrt(q_p)), STEP_FLOOR), q_p)
                    return hook
                hooks = [m.register_forward_pre_hook(init(relu)) for _, m, relu in quants]
                with torch.no_grad():
                    model(batch(0))
            else:
                observed = {n: Histogram() for n, _, _ in quants}

                def observer(name, relu):
                    def hook(module, inputs, output):
                        x = F.relu(inputs[0]) if relu else inputs[0]
                        observed[name].observe(x)
                        return x
                    return hook
                hooks = [m.register_forward_hook(observer(n, relu is m)) for n, m, relu in quants]
                with torch.no_grad():
                    for i in range(self.init_batches):
                        model(batch(i))
                for n, m, _ in quants:
                    set_step(m, max(mse_step(observed[n], 0, q_p), STEP_FLOOR), q_p)
        finally:
            for h in hooks:
                h.remove()
            with torch.no_grad():
                for b, before in buffers:
                    b.copy_(before)
        steps = [float(scale_parameter(m).detach().abs()) / q_p for _, m, _ in quants]
        print(f"brevitas: {len(quants)} activation steps from "
              + ("the first batch (2·mean|x|/√Q_P)" if self.step_init == "paper"
                 else f"the MSE calibrator over {self.init_batches} batch(es)")
              + f": {min(steps):.4g} .. {max(steps):.4g}", flush=True)

    def report_extra(self):
        return {"quantizer": {
            "weights": f"QuantConv2d, signed {self.bits[0]}-bit, learned scale per "
                       + ("output channel" if self.per_channel else "tensor"),
            "activations": f"QuantReLU / QuantIdentity, unsigned {self.bits[1]}-bit, learned scale per tensor",
            "step_init": self.step_init, "init_batches": self.init_batches,
            "kd": {"temperature": self.kd[0], "alpha": self.kd[1]} if self.kd else None}}


def main():
    common.run(Brevitas())


if __name__ == "__main__":
    main()
