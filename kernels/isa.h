#pragma once
// The instruction-set variants of the bitpacked kernels: core/isa.h's, under the kernels' names.

#include "core/isa.h"

namespace whittle::kernels {

using whittle::active_isa;
using whittle::Isa;
using whittle::isa_name;
using whittle::isa_supported;
using whittle::parse_isa;
using whittle::set_isa;
using whittle::supported_isas;

}  // namespace whittle::kernels
