#pragma once
// What the binary methods (bnn, xnor) share: widths 1 or 32, their weight quantizer of the
// method's own name, the sign binarizer on activations (or RSign, its learned-threshold form), and
// the options of the newer binary networks: the sign's gradient (STE, Bi-Real's ApproxSign,
// IR-Net's EDE on a schedule), IR-Net's balanced standardized weights (Libra-PB) and ReActNet's
// learned thresholds. Internal to quantize/.

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "quantize/method.h"

namespace whittle::quantize {

/// How the sign's gradient is approximated; the forward is sign(x) ∈ {−1, +1}, sign(0) = +1, in
/// every case.
enum class SignGradient {
  kSte,         ///< 1 where |x| ≤ 1 (BNN, Hubara et al. 2016)
  kApproxSign,  ///< 2 − 2|x| where |x| < 1, else 0 (Bi-Real Net's ApproxSign, Liu et al. 2018)
  kEde,         ///< k·t·(1 − tanh²(t·x)), k = max(1/t, 1) (IR-Net's error decay estimator, Qin et al. 2020)
};

/// The SignGradient named "ste", "approx_sign" or "ede"; throws whittle::Error for another name.
SignGradient sign_gradient_named(const std::string& name);

/// sign(x) with the gradient `g`; `t` is EDE's t (> 0; unused by the others). With kSte this is
/// bnn_sign(x) (the fused kernels included).
at::Tensor sign_with_gradient(const at::Tensor& x, SignGradient g, double t);

/// IR-Net's EDE schedule: t = t_min·10^(p·log10(t_max/t_min)) at progress p ∈ [0, 1] (clamped).
double ede_t(double progress, double t_min, double t_max);

/// Libra-PB's balanced, standardized weight (IR-Net, Qin et al. 2020, eq. 7): per channel along
/// `axis`, (w − mean)/std with the unbiased std; a channel whose std is 0 is only centred (it
/// becomes 0, whose sign is +1). Differentiable.
at::Tensor libra_standardize(const at::Tensor& w, int64_t axis);

/// The attributes a sign quantizer (weights or activations) reads for its gradient: sign_gradient
/// ("ste" | "approx_sign" | "ede") and ede_t.
std::vector<AttrSpec> sign_gradient_attributes();
/// sign_with_gradient(x, <node's sign_gradient>, <node's ede_t>).
at::Tensor node_sign(const Node& node, const at::Tensor& x);

/// The options every binary method has (BnnOptions and XnorOptions derive from it).
struct BinaryOptions {
  /// The sign's gradient for weights and activations: ste, approx_sign or ede.
  std::string sign_gradient = "ste";
  /// EDE's t at the start and the end of its schedule (the quantize entry's window to the run's end).
  double ede_t_min = 0.1;
  double ede_t_max = 10.0;
  /// Activations through RSign: sign(x − β) with β learned per channel (ReActNet).
  bool learned_threshold = false;
  /// Weights balanced and standardized per output channel before the sign (IR-Net's Libra-PB).
  bool weight_standardize = false;
};

/// Adds the BinaryOptions keys to a method's schema (`Options` derives from BinaryOptions).
template <typename Options>
OptionsSchema<Options>& add_binary_keys(OptionsSchema<Options>& schema) {
  return schema
      .template add<std::string>("sign_gradient", &Options::sign_gradient,
                                 "the sign's gradient for weights and activations: ste (1 where |x| <= 1), approx_sign "
                                 "(Bi-Real: 2 - 2|x|), ede (IR-Net's error decay estimator, t from ede_t_min to ede_t_max "
                                 "over the run)",
                                 {"ste", "approx_sign", "ede"})
      .template add<double>("ede_t_min", &Options::ede_t_min, "EDE's t at the start of the quantize entry (> 0)")
      .template add<double>("ede_t_max", &Options::ede_t_max, "EDE's t at the end of the run (>= ede_t_min)")
      .template add<bool>("learned_threshold", &Options::learned_threshold,
                          "activations through RSign, sign(x - shift) with a shift learned per channel (ReActNet)")
      .template add<bool>("weight_standardize", &Options::weight_standardize,
                          "weights balanced and standardized per output channel before the sign (IR-Net's Libra-PB)");
}

/// Checks BinaryOptions' values in config `c` (keys that would change nothing are refused too:
/// learned_threshold at activation_bits 32, EDE's t without sign_gradient ede); throws
/// whittle::Error (usage) "quantize: method '<m>', key ...".
void check_binary_options(const std::string& method, const Config& c, const BinaryOptions& o);

/// The sign binarizer's act_quant plan ("sign", or "rsign" with learned_threshold) with the
/// gradient attributes; nullopt at activation_bits 32.
std::optional<ActivationPlan> sign_activation_plan(const Config& c, const BinaryOptions& o);

/// The attributes a binary weight quantizer reads on its layer: sign_gradient, ede_t (as
/// sign_gradient_attributes()) and weight_standardize.
std::vector<AttrSpec> binary_weight_attributes();
/// Sets those attributes on a layer from the method's options.
void attach_binary_weight(Node& layer, const BinaryOptions& o);
/// The weight a binary weight quantizer takes the sign of: Libra-PB's standardized weight when the
/// layer's weight_standardize is set, else `w`.
at::Tensor binary_weight_input(const Node& layer, const at::Tensor& w);
/// Registers RSign ("rsign"), the sign with a learned threshold (called by register_bnn).
void register_binary_quantizers();
/// Registers the bireal_shortcuts pass (bireal.cpp; called by register_all).
void register_bireal_pass();

/// Creates RSign's shift [C] (zeros, on the device and in the dtype of `layers`' weights) on every
/// rsign act_quant node of the graph that has none, from its input's channel count (the quantize
/// pass's finish step).
void attach_rsign_shifts(Graph& graph, const std::vector<std::string>& layers);

/// EDE's schedule: sets ede_t on the layers `method`'s weight quantizer holds and on the sign and
/// rsign act_quant nodes, from the whole epochs done within [schedule_start_epoch,
/// schedule_end_epoch); returns the nodes whose t changed (0 without EDE).
int64_t binary_schedule(Graph& graph, const Config& c, const BinaryOptions& o, const std::string& method, double epoch);

/// A binary method with options `Options` (derived from BinaryOptions): weight_bits and
/// activation_bits default to 1 and are 1 or 32; weights go through the weight quantizer named as
/// the method, activations through sign or RSign.
template <typename Options>
class BinaryMethod : public MethodWithOptions<Options> {
 public:
  std::string weight_bits_text() const override { return "1 or 32"; }
  std::string activation_bits_text() const override { return "1 or 32"; }
  Config resolve(const Config& in) const override {
    Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 1;
    if (c.activation_bits == 0) c.activation_bits = 1;
    if (c.weight_bits != 1 && c.weight_bits != 32) bad_bits(this->name(), "weight_bits", c.weight_bits, "1 or 32");
    if (c.activation_bits != 1 && c.activation_bits != 32)
      bad_bits(this->name(), "activation_bits", c.activation_bits, "1 or 32");
    check_binary_options(this->name(), c, this->options(c));  // checks the keys given
    return c;
  }
  std::string weight_quantizer(const Config& c) const override { return c.weight_bits == 32 ? "" : this->name(); }
  std::optional<ActivationPlan> activations(const Config& c) const override {
    return sign_activation_plan(c, this->options(c));
  }
  void finish(Graph& graph, const Config& c, const std::vector<std::string>& layers, const RealSources&,
              Report&) const override {
    if (c.activation_bits == 1 && this->options(c).learned_threshold) attach_rsign_shifts(graph, layers);
  }
  int64_t at_epoch(Graph& graph, const Config& c, double epoch) const override {
    return binary_schedule(graph, c, this->options(c), this->name(), epoch);
  }
  // Stages: activations first (W32A1), then the weights too (W1A1), as ReActNet trains. The
  // later entry's apply() binarizes the weights (the quantize modifier); a stage at the same widths
  // has nothing to carry, and the modifier refuses a stage returning anything to 32 bits.
  bool changes_bits() const override { return true; }
  void change_bits(Graph&, const std::vector<std::string>&, const Config&) const override {}
};

}  // namespace whittle::quantize
