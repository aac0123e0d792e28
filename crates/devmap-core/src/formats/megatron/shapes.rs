//! What the tensors' shapes say of a Megatron-Core model (its layers, widths,
//! experts, latent attention), for the head counts' check and config.json.

use std::collections::BTreeMap;
use std::path::Path;

use super::args::{self, Shapes};
use super::{layout, names};
use crate::formats::{FormatError, Kind};
use crate::types::DType;
use crate::types::pieces::Piece;

/// What the tensors' shapes say of the model.
pub(super) fn shapes(
    metadata: &Path,
    sources: &BTreeMap<String, (DType, Vec<u64>, Vec<Piece>)>,
) -> Result<Shapes, FormatError> {
    // Every saved name's map key and layer, worked out once (a model with its experts
    // saved apart has tens of thousands of names, and each lookup below walks them).
    let keyed: Vec<(String, Option<u64>, &[u64])> = sources
        .iter()
        .map(|(name, s)| {
            let (key, layer) = names::key_of(name);
            (key, layer, s.1.as_slice())
        })
        .collect();
    let find = |key: &str| {
        keyed
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|&(_, _, shape)| shape)
    };
    let need = |key: &str| -> Result<&[u64], FormatError> {
        find(key).ok_or_else(|| {
            FormatError::invalid_as(
                Kind::Missing,
                metadata,
                format!(
                    "is a Megatron-Core checkpoint without `{key}`: not a GPT model devmap can map"
                ),
            )
        })
    };
    let stacked = |name: &str| sources.contains_key(name);
    let embedding = need("embedding.word_embeddings.weight")?;
    let latent = latent_shapes(&find, &need)?;
    // The tensor every layer's attention has, which counts the layers.
    let qkv_name = if latent.is_some() {
        layout::LATENT_KV_DOWN
    } else {
        "decoder.layers.self_attention.linear_qkv.weight"
    };
    let qkv = need(qkv_name)?;
    let proj = need("decoder.layers.self_attention.linear_proj.weight")?;
    // A dense MLP, or experts (`[layers,] experts, hidden, ffn`) and their router
    // (`[layers,] experts, hidden`).
    let experts_fc2 = find("decoder.layers.mlp.experts.experts.linear_fc2.weight");
    let router = find("decoder.layers.mlp.router.weight");
    let dense_fc2_key = "decoder.layers.mlp.linear_fc2.weight";
    let dense_fc2 = find(dense_fc2_key);
    let fc2 = match (dense_fc2, experts_fc2) {
        (Some(fc2), _) | (None, Some(fc2)) => fc2,
        (None, None) => need(dense_fc2_key)?,
    };
    let layers = if stacked(qkv_name) {
        qkv.first().copied().unwrap_or(0)
    } else {
        keyed.iter().filter(|(k, _, _)| k == qkv_name).count() as u64
    };
    // The layers whose MLP is dense, when they are the first ones (a stacked dense MLP
    // is every layer's).
    let dense_layers: Vec<u64> = keyed
        .iter()
        .filter(|(k, _, _)| k == dense_fc2_key)
        .map(|&(_, layer, _)| layer)
        .collect::<Option<Vec<u64>>>()
        .unwrap_or_else(|| (0..layers).collect());
    let dense_prefix = (dense_layers
        .iter()
        .copied()
        .eq(0..dense_layers.len() as u64))
    .then_some(dense_layers.len() as u64);
    // (In an MLA model, `q_layernorm` is the latent query's norm, not a per-head one.)
    let qk_norm = find("decoder.layers.self_attention.q_layernorm.weight")
        .map(last_dim)
        .filter(|_| latent.is_none());
    Ok(Shapes {
        layers,
        hidden: embedding.get(1).copied().unwrap_or(0),
        vocab: embedding.first().copied().unwrap_or(0),
        ffn: last_dim(fc2),
        qkv_rows: row_dim(qkv),
        attention_width: last_dim(proj),
        qk_norm,
        qkv_bias: find("decoder.layers.self_attention.linear_qkv.bias").is_some(),
        tied: !sources.contains_key("output_layer.weight"),
        experts: experts_fc2.and(router).map(row_dim),
        expert_ffn: experts_fc2.map(last_dim),
        expert_bias: find("decoder.layers.mlp.router.expert_bias").is_some(),
        dense_mlp: dense_fc2.is_some(),
        dense_prefix,
        latent,
        shared_ffn: find("decoder.layers.mlp.shared_experts.linear_fc2.weight").map(last_dim),
        shared_gate: find("decoder.layers.mlp.shared_experts.gate_weight").is_some(),
    })
}

/// A shape's last dimension (a row's length; 0 for a scalar).
fn last_dim(shape: &[u64]) -> u64 {
    shape.last().copied().unwrap_or(0)
}

/// A shape's rows: the dimension before the last (0 for fewer than two).
fn row_dim(shape: &[u64]) -> u64 {
    shape
        .get(shape.len().saturating_sub(2))
        .copied()
        .unwrap_or(0)
}

/// Multi-latent attention's shapes, when the checkpoint has its latent key/value
/// projection.
fn latent_shapes<'a>(
    find: &dyn Fn(&str) -> Option<&'a [u64]>,
    need: &dyn Fn(&str) -> Result<&'a [u64], FormatError>,
) -> Result<Option<args::LatentShapes>, FormatError> {
    let Some(kv_down) = find(layout::LATENT_KV_DOWN) else {
        return Ok(None);
    };
    let attention = "decoder.layers.self_attention.";
    let kv_norm = find(&format!("{attention}kv_layernorm.weight"))
        .or_else(|| find(&format!("{attention}linear_kv_up_proj.layer_norm_weight")));
    let kv_lora_rank = match kv_norm {
        Some(norm) => last_dim(norm),
        None => last_dim(need(&format!("{attention}kv_layernorm.weight"))?),
    };
    let kv_up = need(&format!("{attention}linear_kv_up_proj.weight"))?;
    let q_down = find(&format!("{attention}linear_q_down_proj.weight"));
    let q = match q_down {
        Some(_) => need(&format!("{attention}linear_q_up_proj.weight"))?,
        None => need(&format!("{attention}linear_q_proj.weight"))?,
    };
    Ok(Some(args::LatentShapes {
        q_lora_rank: q_down.map(row_dim),
        q_rows: row_dim(q),
        kv_lora_rank,
        rope_dim: row_dim(kv_down).saturating_sub(kv_lora_rank),
        kv_up_rows: row_dim(kv_up),
    }))
}
