// Model FLOPs utilisation (MFU) as llama3_train prints it, and as tools/fsdp2_reference.py computes it for the
// PyTorch side of scripts/gpu-run.sh, in PaLM's and torchtitan's convention:
//
//   FLOPs per token = 6 * N + 12 * layers * hidden * seq    (forward + backward of every weight that multiplies,
//                                                             plus attention's QK^T and PV, the causal mask not
//                                                             subtracted)
//   N               = the parameters without the input embedding table (a lookup, no FLOPs); the LM head is a
//                     GEMM and is counted; a tied model's one matrix counts once, as the LM head
//   MFU             = FLOPs per token * tokens/s per GPU / the GPU's peak dense bf16 FLOP/s
//
// Recomputation (activation checkpointing) is not counted: MFU is about the model's FLOPs, not the hardware's.
// The peak comes from the device name (NVIDIA's data sheets, dense, no sparsity): H100 SXM and H200 989e12,
// H100 NVL 835e12, H100 PCIe 756e12, L40S 362e12, A100 312e12; any other device has no known peak and no MFU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "model_config.hpp"

namespace llama3 {

// N above: num_parameters() less vocab * hidden for an untied model, num_parameters() for a tied one.
int64_t flop_parameters(const ModelConfig& config);

double model_flops_per_token(const ModelConfig& config, int64_t seq_len);

// Peak dense bf16 FLOP/s of a GPU named as cudaDeviceProp::name names it ("NVIDIA H100 80GB HBM3"); nullopt
// when unknown.
std::optional<double> peak_bf16_flops(const std::string& device_name);

// MFU in [0, 1] for `tokens_per_s_per_gpu`; nullopt without a known peak.
std::optional<double> model_flops_utilization(const ModelConfig& config, int64_t seq_len, double tokens_per_s_per_gpu,
                                              std::optional<double> peak_flops);

}  // namespace llama3
