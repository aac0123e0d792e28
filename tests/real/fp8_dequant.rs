//! Dequantization against torch, transformers and compressed-tensors: fine-grained FP8 (see
//! tests/python/fp8_dequant.py): bit-exact with DeepSeek's formula for every output
//! dtype, with transformers' `Fp8Dequantize` where blocks divide the weights,
//! `from_pretrained(OUT)` loads with no missing or unexpected key and the reference
//! logits; a LoRA adapter made on the dequantized model merges bit-identically with
//! peft's `merge_and_unload` + `save_pretrained`. Ignored by a bare `cargo test`; `.ci/run` runs it with `--include-ignored`.

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn fp8_checkpoints_dequantize_bit_exact_with_torch_and_transformers() {
    let (ok, out, err) = crate::common::run_hf_script("fp8_dequant.py");
    assert!(ok, "FP8 dequantization check failed:\n{out}\n{err}");
    assert_eq!(out.matches("bit-exact").count(), 6, "{out}");
    assert_eq!(
        out.matches("(and with transformers' Fp8Dequantize)")
            .count(),
        3,
        "{out}"
    );
    assert!(
        out.contains("ok: LoRA merged into 6 dequantized FP8 weights"),
        "{out}"
    );
}

/// MXFP4 (gpt-oss) against transformers (tests/python/mxfp4_dequant.py): every element
/// of `devmap save --dtype bfloat16|float16|float32` bit-identical with what
/// transformers writes after loading the checkpoint dequantized (and with its
/// `convert_moe_packed_tensors`), every E8M0 exponent but NaN's included; logits equal;
/// verify clean.
#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn mxfp4_checkpoints_dequantize_bit_exact_with_transformers() {
    let (ok, out, err) = crate::common::run_hf_script("mxfp4_dequant.py");
    assert!(ok, "MXFP4 dequantization check failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: mxfp4 to ").count(), 3, "{out}");
    // LoRA on the fused experts merged while dequantizing, and into the plain gpt-oss.
    assert_eq!(
        out.matches("ok: LoRA (target_parameters").count(),
        2,
        "{out}"
    );
}

/// compressed-tensors `float-quantized` FP8 against transformers with the
/// compressed-tensors library (tests/python/compressed_fp8.py): per-tensor, per-channel
/// and per-group scales, stored in bfloat16 and float32, to bfloat16, float16 and float32:
/// bit-identical with transformers' dequantized save, logits equal, verify clean; a
/// `marlin-24` config (2:4 sparse, not dequantized) refused.
#[test]
#[ignore = "needs torch, transformers, compressed-tensors: run .ci/run"]
fn compressed_tensors_fp8_dequantizes_bit_exact_with_transformers() {
    let (ok, out, err) = crate::common::run_hf_script("compressed_fp8.py");
    assert!(ok, "compressed-tensors check failed:\n{out}\n{err}");
    assert_eq!(
        out.matches("ok: compressed-tensors FP8,").count(),
        18,
        "{out}"
    );
    assert!(out.contains("ok: a marlin-24 config is refused"), "{out}");
    assert!(
        out.contains("ok: LoRA merged into 6 dequantized compressed-tensors FP8 weights"),
        "{out}"
    );
}

/// compressed-tensors `pack-quantized` integers (tests/python/packed_int.py), packed by
/// compressed-tensors' own compressor: 4 and 8 bits, groups of 32/64/128, per row and
/// per tensor, symmetric and asymmetric, bfloat16/float16/float32 scales, each to
/// bfloat16, float16 and float32: bit-identical with transformers' dequantized save
/// (compressed-tensors' `decompress` inside), logits equal, verify clean; a LoRA adapter
/// made by peft on the dequantized model merges bit-identically (the QLoRA flow).
#[test]
#[ignore = "needs torch, transformers, compressed-tensors: run .ci/run"]
fn compressed_tensors_packed_integers_dequantize_bit_exact_with_transformers() {
    let (ok, out, err) = crate::common::run_hf_script("packed_int.py");
    assert!(ok, "pack-quantized check failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: pack-quantized ").count(), 24, "{out}");
    assert_eq!(
        out.matches("logits equal, verify clean").count(),
        8,
        "{out}"
    );
    assert!(
        out.contains("ok: LoRA merged into 6 dequantized INT4 weights"),
        "{out}"
    );
}

/// compressed-tensors `pack-quantized` in activation order (`actorder: group`,
/// `weight_g_idx`; tests/python/packed_int_actorder.py), against compressed-tensors
/// 0.18.0's own `decompress` (the last release that reads it; `.ci/run` installs it
/// apart): 4 and 8 bits, groups of 32/64/128, symmetric and asymmetric, three scale
/// dtypes, each to bfloat16, float16 and float32, bit-identical, logits equal, verify
/// clean; a LoRA adapter merges bit-identically with peft.
#[test]
#[ignore = "needs torch, transformers, peft, compressed-tensors 0.18.0: run .ci/run"]
fn compressed_tensors_activation_order_dequantizes_bit_exact_with_compressed_tensors() {
    let (ok, out, err) = crate::common::run_hf_script("packed_int_actorder.py");
    assert!(
        ok,
        "activation-order pack-quantized check failed:\n{out}\n{err}"
    );
    assert_eq!(out.matches("ok: pack-quantized ").count(), 12, "{out}");
    assert_eq!(
        out.matches("logits equal, verify clean").count(),
        4,
        "{out}"
    );
    assert!(
        out.contains("ok: LoRA merged into 6 dequantized activation-order INT4 weights"),
        "{out}"
    );
}

/// GPTQ and AWQ (tests/python/gptq_awq.py): AWQ GEMM 4-bit against AutoAWQ's own
/// `dequantize_gemm`, GPTQ 4 and 8-bit, v1 (zero points stored minus one, carries) and
/// v2, with and without activation order, against GPTQModel's `dequantize_weight`
/// arithmetic: bit for bit in float16, bfloat16 and float32, logits equal, verify clean,
/// side files left out; LoRA merged bit-identically with peft; six hostile variants
/// refused by name.
#[test]
#[ignore = "needs torch, transformers, peft, autoawq: run .ci/run"]
fn gptq_and_awq_dequantize_bit_exact_with_their_references() {
    let (ok, out, err) = crate::common::run_hf_script("gptq_awq.py");
    assert!(ok, "GPTQ/AWQ check failed:\n{out}\n{err}");
    assert_eq!(
        out.matches(
            "weights bit for bit the reference's in float16, bfloat16, float32; logits equal"
        )
        .count(),
        9,
        "AWQ and 8 GPTQ variants:\n{out}"
    );
    assert_eq!(
        out.matches("merged bit-identically with peft").count(),
        2,
        "{out}"
    );
    assert_eq!(out.matches(": refused (").count(), 6, "{out}");
    assert!(out.contains("gptq/awq: all checks passed"), "{out}");
}

/// NVIDIA ModelOpt NVFP4 (tests/python/modelopt_nvfp4.py): a Llama quantized by
/// ModelOpt's own `NVFP4QTensor` on CPU, stored as its export stores it, dequantized to
/// bfloat16, float16 and float32 bit for bit what `NVFP4QTensor.dequantize` computes,
/// logits equal, verify clean; a LoRA adapter made by peft on the dequantized model
/// merges bit-identically; a NaN block scale and a zero global scale refused.
#[test]
#[ignore = "needs torch, transformers, peft, nvidia-modelopt: run .ci/run"]
fn modelopt_nvfp4_dequantizes_bit_exact_with_modelopt() {
    let (ok, out, err) = crate::common::run_hf_script("modelopt_nvfp4.py");
    assert!(ok, "ModelOpt NVFP4 check failed:\n{out}\n{err}");
    assert_eq!(
        out.matches("weights bit for bit ModelOpt's dequantize, verify clean")
            .count(),
        3,
        "{out}"
    );
    assert_eq!(out.matches(": refused (").count(), 2, "{out}");
    assert!(
        out.contains("LoRA merged into 6 dequantized ModelOpt NVFP4 weights: bit-identical"),
        "{out}"
    );
    assert!(out.contains("modelopt nvfp4: all checks passed"), "{out}");
}

/// A fine-grained FP8 checkpoint mixing FP8 blocks (E8M0 and float32 scales) with
/// DeepSeek-V4's FP4-packed weights (tests/python/fp8_fp4_mixed.py): to bfloat16,
/// float16 and float32 bit for bit the parameters transformers' `Fp8Dequantize` loads,
/// logits equal, verify clean; uneven scale grids and NaN scales refused.
#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn fp8_with_fp4_packed_weights_dequantizes_bit_exact_with_transformers() {
    let (ok, out, err) = crate::common::run_hf_script("fp8_fp4_mixed.py");
    assert!(ok, "FP8 + FP4 check failed:\n{out}\n{err}");
    assert_eq!(
        out.matches("8 FP8 and 6 FP4 weights bit for bit transformers' Fp8Dequantize, logits equal, verify clean")
            .count(),
        3,
        "{out}"
    );
    assert_eq!(out.matches(": refused (").count(), 2, "{out}");
    assert!(out.contains("fp8 + fp4: all checks passed"), "{out}");
}

/// compressed-tensors NVFP4 and MXFP8 (tests/python/nvfp4_mxfp8.py), made with
/// compressed-tensors' own presets and compressors: each to bfloat16, float16 and
/// float32 bit-identical with transformers' dequantized save, logits equal, verify clean;
/// a LoRA adapter made by peft on the dequantized NVFP4 model merges bit-identically.
#[test]
#[ignore = "needs torch, transformers, compressed-tensors: run .ci/run"]
fn compressed_tensors_nvfp4_and_mxfp8_dequantize_bit_exact_with_transformers() {
    let (ok, out, err) = crate::common::run_hf_script("nvfp4_mxfp8.py");
    assert!(ok, "NVFP4/MXFP8 check failed:\n{out}\n{err}");
    assert_eq!(
        out.matches("ok: nvfp4-pack-quantized to ").count(),
        3,
        "{out}"
    );
    assert_eq!(out.matches("ok: mxfp8-quantized to ").count(), 3, "{out}");
    assert!(
        out.contains("ok: LoRA merged into 6 dequantized NVFP4 weights"),
        "{out}"
    );
}

/// `devmap save --quantize fp8-block` against transformers' FP8 quantizer
/// (tests/python/fp8_quantize.py): the weights transformers' FP8 integration converts,
/// each bit-identical with its `Fp8Quantize` op; the rest as stored; `from_pretrained`
/// loads the result with no missing or unexpected key; verify clean.
#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn fp8_block_quantization_is_transformers_own() {
    let (ok, out, err) = crate::common::run_hf_script("fp8_quantize.py");
    assert!(ok, "FP8 quantization check failed:\n{out}\n{err}");
    assert!(
        out.contains(
            "ok: 14 linear weights quantized to FP8 bit-identical with transformers' Fp8Quantize"
        ),
        "{out}"
    );
}
