//! `devmap plan --device-map MODE` against what `from_pretrained(device_map=MODE)`
//! really plans (tests/python/transformers_plan.py): six families × ten budgets over
//! one, two and three GPUs × "auto", "balanced_low_0" and "sequential" × four dtype
//! setups (stored bfloat16 or float32, loaded as stored or in the other), captured
//! from transformers' own `from_pretrained`. Ignored by a bare `cargo test`; `.ci/run`
//! runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn devmap_plan_places_every_tensor_where_from_pretrained_does() {
    let (ok, out, err) = crate::common::run_hf_script("transformers_plan.py");
    assert!(ok, "plans differ from from_pretrained's:\n{out}\n{err}");
    assert!(
        out.contains("720 of 720 cases place every tensor as from_pretrained does"),
        "{out}"
    );
    // And the map itself, key for key: the modules without tensors it names
    // (`transformer.drop`) included.
    assert!(
        out.contains("720 of 720 cases give from_pretrained's map key for key"),
        "{out}"
    );
    // `--transformers` asks the planner itself: agreement said (also for the budgets
    // `--reserve-kv` lowers), a difference named.
    assert_eq!(out.matches("\nasked ").count(), 3, "{out}");
}

/// `devmap plan --context N --batch 2` against the KV cache transformers fills
/// (tests/python/kv_cache.py): Llama, Qwen2, Mistral, Gemma 2, Gemma 3, Qwen3,
/// DeepSeek V3 (MLA), gpt-oss and the hybrids Qwen3-Next, LFM2 and Jamba at 3, 6 and
/// 20 tokens, every layer's bytes equal to what its `DynamicCache` layer holds.
#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn plan_counts_the_kv_cache_transformers_holds() {
    let (ok, out, err) = crate::common::run_hf_script("kv_cache.py");
    assert!(
        ok,
        "KV cache counts differ from transformers':\n{out}\n{err}"
    );
    assert_eq!(
        out.matches("as transformers' DynamicCache holds it")
            .count(),
        33,
        "{out}"
    );
}

/// The bytes `devmap plan` counts for quantized checkpoints against
/// `get_memory_footprint()` of what `from_pretrained` holds
/// (tests/python/quantized_footprint.py): NVFP4, MXFP8, packed INT4 and FP8, each as
/// compressed-tensors' compressed modules hold it.
#[test]
#[ignore = "needs torch, transformers, compressed-tensors: run .ci/run"]
fn plan_counts_quantized_weights_as_transformers_holds_them() {
    let (ok, out, err) = crate::common::run_hf_script("quantized_footprint.py");
    assert!(
        ok,
        "quantized sizes differ from transformers':\n{out}\n{err}"
    );
    assert_eq!(out.matches(", get_memory_footprint() ").count(), 4, "{out}");
}

/// `devmap plan --context N`'s activation estimate against the bytes torch allocates in
/// transformers' own forward over N tokens (tests/python/activations.py): Llama, Qwen2,
/// Qwen3, Mistral, a Llama whose attention outgrows its MLP, Mixtral, Qwen3-MoE and
/// Qwen2-MoE (a shared expert, a sliding-window mask), float32 and bfloat16, 1024 and
/// 4096 tokens, each within 3%.
#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn plan_estimates_the_activations_transformers_allocates() {
    // One malloc arena from the interpreter's start (the script's reading of the bytes
    // allocated needs it): a fresh interpreter, not the tests' zygote's child.
    let one_arena = [("MALLOC_ARENA_MAX", "1".into())];
    let (ok, out, err) = crate::common::run_hf_script_with("activations.py", &one_arena);
    assert!(ok, "activation estimates off:\n{out}\n{err}");
    assert_eq!(out.matches("within 3%:").count(), 32, "{out}");
}
