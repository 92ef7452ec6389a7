"""benchmarks/profile_step.py's split of a step: real operator and kernel names from an H100 profile
(torch 2.11, PyramidNet-110 in bf16, channels_last, and in fp32/fp16 NCHW for cuDNN's BatchNorm and
layout kernels) must land in the category of what they compute, whichever library ran them; the
script's CPU run, as a user runs it, and its refusals. Its GPU run is tests/gpu's."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

import runkit
from benchmarks import profile_step
from benchmarks.profile_step import (achieved, breakdown, category, conv_pass, conv_passes,
                                     device_times, is_conv_layout, summary)
from benchmarks.roofline import (Op, bandwidth_tbs, model_of, roofline, share_of_roofline,
                                 step_ops)
from conftest import run_script
from pyramidnet import PyramidNet
from test_fast_path import in_process

# As the H100 profiles printed them: kernels cut at 120 characters, operators at 80.
CONVOLUTION = [
    "aten::addmm",
    "aten::conv2d",
    "aten::convolution_backward",
    "aten::cudnn_convolution",
    "aten::mm",
    "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMultistageINS_4gem",
    "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segmen",
    "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1_execute_segmen",
    "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x128x64_warpgroupsize2x1x1_g1_execute_segmen",
    "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1_g1_execute_segment",
    "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x256x64_warpgroupsize1x1x1_g1_execute_segment",
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segmen",
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1_execute_segmen",
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x128x64_warpgroupsize2x1x1_g1_execute_segmen",
    "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1_execut",
    "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x64x64_warpgroupsize1x1x1_g1_execute",
    "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x128x64_warpgroupsize2x1x1_g1_execut",
    "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x64_warpgroupsize1x1x1_g1_execute",
    "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_warpgroupsize1x1x1_g1_execute_",
    "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::wgrad_indexed::W",  # noqa: E501
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816dgrad_optimized_bf16_128x128_32x4_nhwc_unity_stride_align8>(c",  # noqa: E501
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816dgrad_optimized_bf16_256x64_32x4_nhwc_unity_stride_align8>(cu",  # noqa: E501
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_128x128_32x5_nhwc_align8>(cutlass_tensor",  # noqa: E501
    "void wgrad_alg0_engine_NHWC<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int, float const*, int, float*, float const",  # noqa: E501
]
# cuDNN preparing a convolution's tensors for the tensor cores, inside
# aten::cudnn_convolution/convolution_backward.
CONV_LAYOUT = [
    "void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true, (cudnnKernelDataType_t)0>(int, int, int, int, int, ",  # noqa: E501
    "void nhwcAddPaddingKernel<float, float, float, true, (cudnnKernelDataType_t)0>(int, int, int, int, int, int, int, int, fl",  # noqa: E501
    "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>(cudnn::engi",  # noqa: E501
    "void cudnn::engines_precompiled::nhwcToNchwKernel<__half, __half, float, true, false, (cudnnKernelDataType_t)0>(cudnn::en",  # noqa: E501
    "void tensorTransformGeneric<__half, __half, float, true, false, false, (cudnnKernelDataType_t)0>(cudnnTensorTransformStru",  # noqa: E501
    "void cudnn::engines_precompiled::convertTensor_kernel<float, float, float, (cudnnKernelDataType_t)2>(float, float const*,",  # noqa: E501
]
BATCHNORM = [
    "aten::native_batch_norm",
    "aten::native_batch_norm_backward",
    "void at::native::batch_norm_backward_elemt_channels_last_kernel<4, c10::BFloat16, float, float>(c10::BFloat16 const*, c1",  # noqa: E501
    "void at::native::batch_norm_backward_reduce_channels_last_kernel<4, c10::BFloat16, float, float>(c10::BFloat16 const*, c",  # noqa: E501
    "void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var, c10::BFloat16, float, 4>(c10::BFloa",  # noqa: E501
    "void at::native::batch_norm_transform_input_channels_last_kernel<c10::BFloat16, float, float, 4>(c10::BFloat16 const*, c",  # noqa: E501
    # fp32 and fp16 go through cuDNN's BatchNorm, which the old check
    # ("cudnn" first) counted as convolution
    "aten::batch_norm",
    "aten::_batch_norm_impl_index",
    "aten::cudnn_batch_norm",
    "aten::cudnn_batch_norm_backward",
    "aten::miopen_batch_norm",
    "bn_fw_tr_1C11_kernel_NCHW",
    "bn_bw_1C11_kernel_new",
    "bn_fw_tr_1C11_singleread",
    "batch_norm_collect_statistics_channels_last_kernel",
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, float const*, cudnnTenso",  # noqa: E501
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, float, cudnnTensorStruct, flo",  # noqa: E501
    "void cudnn::bn_fw_tr_1C11_singleread_spec<__half2, 512, 1, 2, 20>(cudnn::bn_fw_tr_1C11_args<__half2>)",  # noqa: E501
    "void cudnn::batchnorm_bwtr_nhwc_semiPersist<float, float, float, 512, 16, 3, 1, 1, 0, true, 2>(cudnn::NhwcBatchNormBwdPar",  # noqa: E501
]
ELEMENTWISE = [
    "Optimizer.zero_grad#SGD.zero_grad",  # the optimizer's own range: zeroing gradients
    "aten::_fused_sgd_",
    "aten::_log_softmax",
    "aten::_log_softmax_backward_data",
    "aten::add",
    "aten::add_",
    "aten::avg_pool2d",
    "aten::avg_pool2d_backward",
    "aten::clamp_min_",
    "aten::copy_",
    "aten::div",
    "aten::fill_",
    "aten::mean",
    "aten::nll_loss_backward",
    "aten::nll_loss_forward",
    "aten::sum",
    "aten::threshold_backward",
    "Memset (Device)",
    "void at::native::(anonymous namespace)::avg_pool2d_backward_out_cuda_frame_nhwc<c10::BFloat16, float, int>(int, c10::BFl",  # noqa: E501
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::T",  # noqa: E501
    "void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorItera",  # noqa: E501
    "void at::native::vectorized_elementwise_kernel<8, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16,",  # noqa: E501
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(i",  # noqa: E501
    "at::native::amp_update_scale_cuda_kernel(float*, int*, float const*, double, double, int)",
]
OTHER = ["Activity Buffer Request"]  # the profiler's own work


@pytest.mark.parametrize("name, kind", [*((name, "convolution")
                                          for name in CONVOLUTION + CONV_LAYOUT),
                                        *((name, "batchnorm") for name in BATCHNORM),
                                        *((name, "elementwise") for name in ELEMENTWISE),
                                        *((name, "other") for name in OTHER)])
def test_names_are_classified_by_what_they_compute(name, kind):
    assert category(name) == kind


def test_only_cudnns_layout_kernels_count_as_conv_layout():
    assert all(is_conv_layout(name) for name in CONV_LAYOUT)
    assert not any(is_conv_layout(name) for name in CONVOLUTION + BATCHNORM + ELEMENTWISE + OTHER)


def test_kernels_split_like_operators_and_show_the_layout_share():
    """An H100 bf16 step in miniature: the padding kernel runs inside the convolution
    operators, so both splits give convolution the same share, and the kernels' split names the
    padding on a line of its own."""
    padding, fprop, bn_kernel = CONV_LAYOUT[0], CONVOLUTION[11], BATCHNORM[4]
    operators = [("aten::convolution_backward", 0.006), ("aten::native_batch_norm", 0.003),
                 ("aten::add_", 0.001)]
    kernels = [(fprop, 0.004), (bn_kernel, 0.003), (padding, 0.002), ("Memset (Device)", 0.001)]
    report = {"device": "NVIDIA H100 80GB HBM3", "config": {"batch_size": 256},
              **breakdown(operators, kernels, 3)}

    assert report["shares"] == \
        pytest.approx({"convolution": 0.6, "batchnorm": 0.3, "elementwise": 0.1, "other": 0})
    assert report["kernel_shares"] == report["shares"]
    assert (report["kernel_seconds"] == pytest.approx(0.010)
            and report["conv_layout_share"] == pytest.approx(0.2))
    assert [row["category"] for row in report["top_kernels"]] == \
        ["convolution", "batchnorm", "convolution"]
    assert [row["conv_layout"] for row in report["top_kernels"]] == [False, False, True]
    assert report["top_kernels"][2]["share"] == pytest.approx(0.2)  # of the kernels' time
    lines = summary(report)
    assert lines[0] == "NVIDIA H100 80GB HBM3, batch 256: 10.00 ms of operator self time per step"
    assert lines[1] == \
        "  operators: convolution 60.0%, batchnorm 30.0%, elementwise 10.0%, other 0.0%"
    assert lines[2] == \
        "  kernels:   convolution 60.0%, batchnorm 30.0%, elementwise 10.0%, other 0.0% of 10.00 ms"
    assert lines[3].startswith("  conv layout/padding kernels: 20.0% of "
                               "kernel time, in convolution")
    assert "conv layout void nhwcAddPaddingKernel" in " ".join(lines[-1].split())


def test_without_kernels_the_report_has_no_kernel_split():
    report = {"device": "cpu", "config": {"batch_size": 32},
              **breakdown([("aten::convolution", 0.002)], [], 5)}
    assert (report["kernel_shares"] is None and report["conv_layout_share"] is None
            and report["top_kernels"] == [])
    assert not any("kernel" in line for line in summary(report))


def test_gpu_annotations_are_not_counted_as_kernels():
    """record_function ranges (the optimizer's) appear on the GPU timeline
    spanning kernels already counted."""
    def event(key, device_type, microseconds, annotation=False):
        return SimpleNamespace(key=key, device_type=device_type,
                               self_device_time_total=microseconds, self_cpu_time_total=0,
                               is_user_annotation=annotation)

    events = [event("aten::cudnn_convolution", DeviceType.CPU, 3000),
              event(CONVOLUTION[11], DeviceType.CUDA, 3000),
              event("Optimizer.step#SGD.step", DeviceType.CUDA, 5000, annotation=True)]
    operators, kernels = device_times(events, cuda=True, steps=2)
    assert (operators == [("aten::cudnn_convolution", 0.0015)]
            and kernels == [(CONVOLUTION[11], 0.0015)])


# --------------------------------------------------------------------------------- passes, roofline
SPLIT_K = ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_splitKreduce_kernel<float, "
           "__nv_bfloat16>")
WGRAD_ALG0 = "void wgrad_alg0_engine_NHWC<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int"
CUTLASS_DGRAD = "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816dgrad_optimized_bf16"
PADDING = "void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true>(int, int"


@pytest.mark.parametrize("kernel, parent, expected", [
    (CONVOLUTION[6], "backward", "dgrad"), (CONVOLUTION[11], "forward", "fprop"),
    (CONVOLUTION[14], "backward", "wgrad"),
    (WGRAD_ALG0, "backward", "wgrad"), (CUTLASS_DGRAD, "backward", "dgrad"),
    (PADDING, "forward", "layout"), (PADDING, "backward", "layout"),
    # cuDNN runs many a dgrad with its fprop kernels: under a backward operator it is dgrad
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "backward", "dgrad"),
    (SPLIT_K, "forward", "fprop"),  # the forward's split-K reduction is the forward's
    (SPLIT_K, "backward", "unattributed"),  # dgrad's or wgrad's: the name does not say
    (CONVOLUTION[6], None, "unattributed"),  # no operator: no pass to take it from
])
def test_a_convolution_kernel_goes_to_the_pass_of_its_operator(kernel, parent, expected):
    assert conv_pass(kernel, parent) == expected


def cpu_op(op_id, name, parent=None, kernels=(), shapes=None):
    """A CPU operator as torch.profiler's events() gives it: its parent, the kernels it launched
    (name, microseconds) and its input shapes."""
    launched = [SimpleNamespace(name=kernel, device=0, duration=us) for kernel, us in kernels]
    return SimpleNamespace(id=op_id, name=name, cpu_parent=parent, input_shapes=shapes,
                           device_type=DeviceType.CPU, linked_correlation_id=0,
                           self_cpu_time_total=0, kernels=launched)


def gpu_kernel(name, microseconds, launched_by):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, is_user_annotation=False,
                           linked_correlation_id=launched_by,
                           time_range=SimpleNamespace(elapsed_us=lambda: microseconds))


def a_profiled_step():
    """Two steps of a stem (3 to 16 channels at 32x32) and one convolution at 16x16, as
    torch.profiler records them on an H100: the operators' tree (conv2d > convolution >
    _convolution > cudnn_convolution forward; the autograd node > convolution_backward, with a
    fill_ inside it, backward), the kernels each launched, and a convolution kernel the profiler
    tied to no operator."""
    stem_in, block_in = [256, 3, 32, 32], [256, 32, 16, 16]
    conv2d = cpu_op(1, "aten::conv2d", shapes=[stem_in, [16, 3, 3, 3]])
    convolution = cpu_op(2, "aten::convolution", conv2d, shapes=[stem_in, [16, 3, 3, 3]])
    inner = cpu_op(3, "aten::_convolution", convolution, shapes=[stem_in, [16, 3, 3, 3]])
    stem = cpu_op(4, "aten::cudnn_convolution", inner, [(CONVOLUTION[11], 200)],
                  [stem_in, [16, 3, 3, 3]])
    block_conv2d = cpu_op(5, "aten::conv2d", shapes=[block_in, [32, 32, 3, 3]])
    block = cpu_op(6, "aten::cudnn_convolution", block_conv2d,
                   [(CONVOLUTION[12], 100), (CONV_LAYOUT[0], 40), (SPLIT_K, 20)],
                   [block_in, [32, 32, 3, 3]])
    node = cpu_op(7, "autograd::engine::evaluate_function: ConvolutionBackward0")
    backward_node = cpu_op(8, "ConvolutionBackward0", node)
    block_backward = cpu_op(9, "aten::convolution_backward", backward_node,
                            [(CONVOLUTION[11], 120), (CONVOLUTION[14], 160), (SPLIT_K, 30)],
                            [block_in, block_in, [32, 32, 3, 3]])
    fill = cpu_op(10, "aten::fill_", block_backward, [(ELEMENTWISE[21], 10)])  # inside the backward
    stem_backward = cpu_op(11, "aten::convolution_backward", None, [(CONVOLUTION[15], 80)],
                           [[256, 16, 32, 32], stem_in, [16, 3, 3, 3]])
    classifier = cpu_op(12, "aten::addmm", None,
                        [("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64", 50)])
    operators = [conv2d, convolution, inner, stem, block_conv2d, block, node, backward_node,
                 block_backward, fill, stem_backward, classifier]
    kernels = [gpu_kernel(k.name, k.duration, op.id) for op in operators for k in op.kernels]
    orphans = [gpu_kernel(CONVOLUTION[7], 40, 999), gpu_kernel("Memset (Device)", 5, 998)]
    return operators + kernels + orphans


def test_kernels_are_attributed_by_their_operator_and_the_rest_shown_as_unattributed():
    """Every kernel launched under a convolution operator counts for that operator's pass, its
    input's resolution read from the operator: the backward's fprop-named kernel as dgrad, the
    kernel of an operator inside the backward, the split-K reductions of the forward as fprop and of
    the backward as unattributed, beside the convolution kernel no operator launched. The
    classifier's GEMM and a memset with no operator are no convolution's."""
    passes = conv_passes(a_profiled_step(), cuda=True, steps=2)
    expected = {"fprop": {"32x32": 0.100, "16x16": 0.060}, "layout": {"16x16": 0.020},
                "dgrad": {"16x16": 0.060}, "wgrad": {"16x16": 0.080, "32x32": 0.040},
                "unattributed": {"16x16": 0.020, "?": 0.020}}
    assert passes.keys() == expected.keys()
    for kind, row in expected.items():
        assert passes[kind] == pytest.approx(row), kind


def test_the_backward_rate_counts_every_backward_kernel_and_the_split_says_what_it_leaves_out():
    """fprop and wgrad do the forward's FLOPs, dgrad the forward's less the stem's; the backward's
    rate is over all its kernels, the unattributed ones too, while dgrad's and wgrad's leave those
    out and say so."""
    ops = [Op("convolution", "convolution", 2_000_000_000, 0),
           Op("convolution", "convolution", 6_000_000_000, 0)]
    kernels = [(CONVOLUTION[11], 0.0004), (BATCHNORM[4], 0.0001)]
    report = {"device": "NVIDIA H100 80GB HBM3", "config": {"batch_size": 256},
              **breakdown(kernels, kernels, 5),
              "conv_passes": conv_passes(a_profiled_step(), cuda=True, steps=2)}
    rates = achieved(report, ops)
    assert rates["fprop_tflops"] == pytest.approx(8e9 / 0.16e-3 / 1e12)
    assert rates["dgrad_tflops"] == pytest.approx(6e9 / 0.06e-3 / 1e12)
    assert rates["wgrad_tflops"] == pytest.approx(8e9 / 0.12e-3 / 1e12)
    assert rates["backward_tflops"] == pytest.approx(14e9 / (0.06 + 0.12 + 0.04) / 1e-3 / 1e12)
    assert rates["unattributed_ms"] == pytest.approx(0.04) and rates["passes_upper_bounds"]
    report["achieved"] = rates
    lines = summary(report)
    assert ("  convolution by pass: fprop 50.0 TFLOP/s, backward 63.6 TFLOP/s (dgrad at most "
            "100.0, wgrad at most 66.7)") in lines
    assert any(line.startswith("  unattributed convolution kernels: 0.040 ms per step")
               for line in lines)
    assert any(line.startswith("    unattributed       ") for line in lines)  # in the pass table


@pytest.mark.parametrize("flags, says", [
    # under CUDA graphs the kernels have no operator above them: the per-pass table would be empty
    (["--compile", "--compile_mode", "reduce-overhead"], "--compile_mode reduce-overhead replays "
     "the step as CUDA graphs"),
    (["--compile", "--compile_mode", "max-autotune"], "--compile_mode max-autotune replays"),
    (["--compile_mode", "max-autotune"], "--compile_mode needs --compile"),  # nothing compiled
    (["--profile_steps", "3"], "here give --steps 3"),
    (["--steps", "0"], "--steps"),
])
def test_what_it_cannot_profile_is_refused_before_the_profile(monkeypatch, flags, says):
    monkeypatch.setattr(profile_step, "profile_steps", lambda *args: pytest.fail("profiled"))
    code, out, err = in_process(profile_step.main, *flags)
    assert code == 2 and err.count("\n") == 1 and says in err and out == "", err
    profile_step.parse(["--compile", "--compile_mode", "max-autotune-no-cudagraphs"])


@pytest.mark.parametrize("where, says", [("missing/profile.json", "in a folder that exists"),
                                         (".", "a file's path (this one is a folder)")])
def test_out_is_checked_before_the_profile(tmp_path, monkeypatch, where, says):
    """A file that cannot be written is refused before minutes of profiling, not after them."""
    monkeypatch.setattr(profile_step, "profile_steps", lambda *args: pytest.fail("profiled"))
    code, _, err = in_process(profile_step.main, "--out", tmp_path / where)
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_profile_splits_a_cpu_step_into_categories(tmp_path):
    """As a user runs it, on the CPU: the split, without rates (a CPU's TFLOP/s would read as a
    GPU's 0.0) and without the profiler's own lines about the GPU it does not find."""
    import json

    out = tmp_path / "profile.json"
    done = run_script("benchmarks/profile_step.py", "--depth", "8", "--alpha", "12", "--batch_size",
                      "16", "--steps", "2", "--warmup_steps", "1", "--top", "5", "--out", out)
    assert done.returncode == 0, done.stderr
    # nothing (once Kineto's "ERROR: ... gpuGetDeviceCount failed"); stdout says it is the CPU
    assert done.stderr == "", done.stderr
    assert "TFLOP/s" not in done.stdout and "GB/s" not in done.stdout
    assert "no rates on the CPU" in done.stdout
    report = json.loads(out.read_text())
    assert set(report["shares"]) == {"convolution", "batchnorm", "elementwise", "other"}
    assert sum(report["shares"].values()) == pytest.approx(1.0)
    # a CNN's step is its convolutions
    assert max(report["shares"], key=report["shares"].get) == "convolution"
    assert len(report["top"]) == 5 and report["top_kernels"] == []  # kernels only on a GPU
    assert "convolution" in done.stdout and "ms of operator self time per step" in done.stdout
    passes = report["conv_passes"]  # on the CPU: forward and backward, by the input's resolution
    assert (set(passes) == {"fprop", "backward"}
            and set(passes["fprop"]) == {"32x32", "16x16", "8x8"})
    assert report["achieved"] is None and report["roofline"] is None
    assert report["config"]["align_channels"] == 0  # the CPU's default, as fast.py's


def test_the_roofline_takes_the_slower_of_compute_and_memory():
    """Per operator the larger of FLOPs at peak and bytes at bandwidth; op by op they add up; fused,
    only the convolutions, the classifier and the update count."""
    # 2 ms of compute, 0.5 ms of bytes
    ops = [Op("convolution", "convolution", 2_000_000_000_000, 1_000_000_000),
           Op("native_batch_norm", "batchnorm", 0, 4_000_000_000),  # 2 ms of bytes
           Op("sgd", "update", 0, 1_000_000_000)]  # 0.5 ms
    bound = roofline(ops, batch=100, peak_tflops=1000.0, bandwidth_tbs=2.0)
    assert (bound["op_by_op_s"] == pytest.approx(0.0045)
            and bound["fused_s"] == pytest.approx(0.0025))
    assert bound["op_by_op_images_per_sec"] == pytest.approx(100 / 0.0045)
    assert bound["categories"]["batchnorm"]["seconds"] == pytest.approx(0.002)
    assert share_of_roofline(100 / 0.009, bound)["op_by_op"] == pytest.approx(0.5)


def test_a_step_of_the_model_has_its_flops_and_the_bytes_of_its_tensors():
    """The recorded step's convolution and classifier FLOPs are the model's FLOPs per
    image (runkit.flops_per_image, as MFU counts them, on the plain model) times the batch; the
    first operator, the stem's convolution, moves its input, weight and output once each; every
    category of a CNN's step is there."""
    ops = step_ops(model_of(8, 12), 4, (3, 32, 32), 10, torch.bfloat16)
    per_image = runkit.flops_per_image(PyramidNet(8, 12), torch.zeros(2, 3, 32, 32))
    assert sum(op.flops for op in ops if op.category in ("convolution", "classifier")) == \
        4 * per_image
    stem = ops[0]
    assert (stem.name == "convolution"
            and stem.bytes == 2 * (4 * 3 * 32 * 32 + 16 * 3 * 9 + 4 * 16 * 32 * 32))
    assert {"convolution", "batchnorm", "elementwise", "classifier", "update"} <= \
        {op.category for op in ops}


# torch.cuda.get_device_name() as each GPU reports it (NVIDIA's driver list), its bandwidth in TB/s
@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0), ("NVIDIA H100 NVL", 3.9),
    ("NVIDIA H200", 4.8), ("NVIDIA H200 NVL", 4.8),
    ("NVIDIA GH200 480GB", 4.0), ("NVIDIA GH200 120GB", 4.0),  # 96 GB HBM3 (the size: Grace's)
    ("NVIDIA GH200 144G HBM3e", 4.9),
    ("NVIDIA A100-SXM4-40GB", 1.555), ("NVIDIA A100-PCIE-40GB", 1.555),
    ("NVIDIA A100-SXM4-80GB", 2.039), ("NVIDIA A100 80GB PCIe", 1.935),
    ("NVIDIA L40S", 0.864), ("NVIDIA GeForce RTX 4090", 1.008), ("NVIDIA GeForce RTX 3090", 0.936),
    ("NVIDIA GeForce RTX 3090 Ti", None), ("NVIDIA GeForce RTX 4090 D", None),  # other cards
    ("NVIDIA H100", None),  # not the 80 GB SXM5: the name does not say which H100
    ("NVIDIA B200", 8.0), ("NVIDIA GB200", 8.0), ("NVIDIA L4", 0.3), ("NVIDIA A10", 0.6),
    ("Tesla V100-SXM2-16GB", 0.9), ("Tesla V100-PCIE-32GB", 0.9), ("Tesla V100S-PCIE-32GB", 1.134),
    ("NVIDIA A10G", None), ("NVIDIA L40", None), ("Tesla P100-PCIE-16GB", None),  # not in the table
])
def test_bandwidth_by_gpu_name(name, expected):
    assert bandwidth_tbs(name) == expected
