#pragma once
// int8 execution in the deploy runtime: the layers an int8 quantizer feeds (quantize/int8.cpp,
// whole_network) run on uint8 activation codes and int8 weight codes, each layer requantizing its
// int32 sums straight to the grid of the quantizer reading its output (Jacob et al. 2018), so that
// consecutive layers exchange uint8 codes; max pooling and flatten move codes.
//
// Kernels: convolutions (groups 1, dilation 1), linear layers and residual additions run on
// whittle's own int8 kernels (kernels/int8_conv.h: AVX-512 VNNI or AVX2, exact int32 sums, weights
// packed once when the plan is built; channels-last codes). A convolution those do not take
// (grouped, dilated) runs on LibTorch's quantized CPU engine (fbgemm) with a prepacked weight, on
// CPUs with VNNI only (see fbgemm_exact). A layer whose output no uint8 quantizer reads (the
// classifier's float logits) runs on the same kernels with float output. Whatever has no integer
// form here (an addition no quantizer reads, int8 symmetric activations) runs in float on the
// dequantized values, exactly as the fake-quant graph does.
//
// The integer path rounds where the graph rounds, but requantizes with a float multiplier where
// the graph divides its float sum by the scale: an output next to a rounding boundary may land
// one code apart (the same as in ONNX Runtime's integer kernels). docs/kernels.md ("Deploy runtime") states the
// tolerance that eval --deploy holds.

#include "deploy/lowering.h"
#include "graph/graph.h"

namespace whittle::deploy {

/// True when this CPU has VNNI (AVX512_VNNI or AVX_VNNI), so that fbgemm's int8 kernels sum
/// exactly. Without it fbgemm adds pairs of uint8 × int8 products in 16 bits (vpmaddubsw), which
/// saturate on full-range codes (255 · 127 · 2 > 32767), so the layers that would need fbgemm run in
/// float on the dequantized values, as the fake-quantized graph computes them.
bool fbgemm_exact();

/// True when int8 steps run here: whittle's own int8 kernels have a vector variant for the active
/// instruction set (kernels::int8_variant() is not scalar: any AVX2 CPU), or fbgemm_exact() (then
/// the convolutions run on fbgemm, the additions in float). Else every int8 step declines and the
/// model runs in float.
bool int8_kernels_available();

/// An int8 quantizer (act_quant with an affine uint8 grid of 8 bits): kernels::
/// int8_quantize_channels_last of its float input (quantize_per_tensor for another dtype or
/// layout), channels-last codes for maps. False (generic step) for any other act_quant, and without
/// int8_kernels_available().
bool lower_int8_quantize(const Node& n, Lowering& l);

/// conv2d or linear reading uint8 codes (Form::int8) with int8 weight codes (packed, uniform 8-bit
/// encoding, zero point 0) whose only user is a uint8 quantizer: one step running the layer on the
/// int8 kernels with that quantizer's scale and zero point (and ReLU), absorbing the quantizer
/// ("int8 conv2d", "int8 linear"; "int8 conv2d (fbgemm)" for a grouped or dilated convolution).
/// Whose output no quantizer reads: the int8 kernels with float output ("int8 linear (float
/// output)"). False otherwise.
bool lower_int8_layer(const Node& n, Lowering& l);

/// add of two uint8-coded values of one shape whose only user is a uint8 quantizer:
/// kernels::int8_add to its grid (with its ReLU), absorbing it. False otherwise.
bool lower_int8_add(const Node& n, Lowering& l);

/// max_pool2d and flatten of uint8 codes on the codes (the grid unchanged). False otherwise.
bool lower_int8_move(const Node& n, Lowering& l);

}  // namespace whittle::deploy
