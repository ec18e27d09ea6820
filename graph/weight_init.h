#pragma once
// How the zoo initializes conv weights: torch.nn's default or He et al. (2015).

#include <string>
#include <vector>

namespace whittle {

/// How a fresh model's conv weights are drawn (build_model, ZooOptions::weight_init; recipes:
/// model.weight_init).
///   kTorch          torch.nn's default: U(−1/√fan_in, 1/√fan_in) (Kaiming-uniform with a = √5,
///                   standard deviation 1/√(3·fan_in)).
///   kKaimingNormal  He et al., 2015 ("Delving deep into rectifiers", eq. 10), the initialization
///                   of the ResNet papers: N(0, 2/fan_in), torch.nn.init.kaiming_normal_ with its
///                   defaults (fan_in, ReLU gain √2). torchvision's ResNet and fb.resnet.torch
///                   use fan_out (= out_channels/groups · kernel²) instead: the same draw
///                   wherever in and out channels agree.
/// fan_in = in_channels/groups · kernel². Linear layers, biases and BN are as kTorch in both.
enum class WeightInit { kTorch, kKaimingNormal };

/// The names of WeightInit values as recipes spell them: "torch", "kaiming_normal".
std::vector<std::string> weight_init_names();
/// The WeightInit named `name` (one of weight_init_names()); throws whittle::Error (usage) naming
/// the known ones otherwise.
WeightInit weight_init_from_name(const std::string& name);

}  // namespace whittle
