"""Feeds bench/gpu_step.py's kind-of-kernel table hand-made profiles: kernel
names as torch.profiler reports them for torch.compile's step, and ops as
megac-run --profile writes them."""
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import gpu_step  # noqa: E402

# ms a step of torch.compile's kernels (FlashAttention 2's forward and
# backward, cuBLAS and CUTLASS products, the fused AdamW, Triton kernels).
torch_ms = {
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)": 4.0,
    "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>(Flash_bwd_params)": 9.0,
    "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x64x128_4x1x1_kernel0_0": 1.0,
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1": 60.0,
    "nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNN": 30.0,
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8>(Params)": 5.0,
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4> >(...)": 12.0,
    "triton_poi_fused_add_native_layer_norm_0": 7.0,
    "triton_red_fused__log_softmax_1": 3.0,
}
# megac's ops over 13 profiled steps.
ops = [
    {"op": "attention_grad", "ms": 260.0, "runs": 312},
    {"op": "attention", "ms": 65.0, "runs": 312},
    {"op": "linear_bias", "ms": 520.0, "runs": 1872},
    {"op": "linear_weight_grad", "ms": 390.0, "runs": 1885},
    {"op": "linear", "ms": 260.0, "runs": 1000},
    {"op": "linear_gelu_grad", "ms": 130.0, "runs": 312},
    {"op": "adam_w", "ms": 156.0, "runs": 26},
    {"op": "layer_norm_grad", "ms": 39.0, "runs": 637},
    {"op": "fused", "ms": 65.0, "runs": 600},
]
rows = gpu_step.category_table("1.3B", torch_ms, ops, 13, limit=3)
# The rows add up to the whole of both steps.
print("torch total", round(sum(t for _, t, _ in rows), 2),
      "megac total", round(sum(m for _, _, m in rows), 2))
