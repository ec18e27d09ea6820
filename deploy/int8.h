#pragma once
// int8 execution in the deploy runtime: the layers an int8 quantizer feeds (quantize/int8.cpp,
// whole_network) run on LibTorch's quantized CPU engine (x86: fbgemm, with VNNI where the CPU has
// it; only there, see int8_kernels_available) on uint8 activations and int8 weights prepacked once
// when the plan is built, each layer
// requantizing its int32 sums straight to the grid of the quantizer reading its output (Jacob et
// al. 2018), so that consecutive layers exchange uint8 codes; max pooling and flatten move codes.
// Whatever has no integer form here (a layer whose output no uint8 quantizer reads, as the
// classifier's float logits; int8 symmetric activations, which the engine does not take) runs in
// float on the dequantized values, exactly as the fake-quant graph does.
//
// The integer path rounds where the graph rounds, but requantizes with a float multiplier where
// the graph divides its float sum by the scale: an output next to a rounding boundary may land
// one code apart (the same as in ONNX Runtime's integer kernels). docs/deploy.md states the
// tolerance that eval --deploy holds.

#include "deploy/lowering.h"
#include "graph/graph.h"

namespace whittle::deploy {

/// True when this CPU has VNNI (AVX512_VNNI or AVX_VNNI). Without it fbgemm adds pairs of
/// uint8 × int8 products in 16 bits (vpmaddubsw), which saturate on full-range codes (255 · 127 · 2
/// > 32767), so the int8 steps decline there and the model runs in float on the dequantized values,
/// as the fake-quantized graph computes it.
bool int8_kernels_available();

/// An int8 quantizer (act_quant with an affine uint8 grid of 8 bits): quantize_per_tensor of its
/// input, channels-last for maps. False (generic step) for any other act_quant, and without
/// int8_kernels_available().
bool lower_int8_quantize(const Node& n, Lowering& l);

/// conv2d or linear reading uint8 codes (Form::int8) with int8 weight codes (packed, uniform 8-bit
/// encoding, zero point 0) whose only user is a uint8 quantizer: one step running the quantized
/// layer with that quantizer's scale and zero point (and ReLU), absorbing the quantizer. False
/// otherwise.
bool lower_int8_layer(const Node& n, Lowering& l);

/// add of two uint8-coded values whose only user is a uint8 quantizer: quantized::add (or add_relu)
/// to its grid, absorbing it. False otherwise.
bool lower_int8_add(const Node& n, Lowering& l);

/// max_pool2d and flatten of uint8 codes on the codes (the grid unchanged). False otherwise.
bool lower_int8_move(const Node& n, Lowering& l);

}  // namespace whittle::deploy
