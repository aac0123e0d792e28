//! What a saved tensor's name says beyond its map key: the layer of a layer saved
//! apart, and the expert and the half of a gated `linear_fc1` saved apart, in each
//! form megatron-core and Megatron-LM write them (stacked in torch_dist,
//! `singleton_local_shards`, and the per-module state dicts of `fsdp_dtensor`).

use super::layout::LAYERS;

/// A saved tensor's name split into its map key and, for a layer saved apart
/// (`decoder.layers.3.mlp…`), its layer: `("decoder.layers.mlp…", Some(3))`.
pub fn key_of(name: &str) -> (String, Option<u64>) {
    let named = parse_name(name);
    (named.key, named.layer)
}

/// What a saved tensor's name says: its map key, its layer (for a layer saved apart),
/// and in megatron-core's `singleton_local_shards` form (each expert a tensor of its
/// own, each half of a gated `linear_fc1` too) its expert
/// (`…mlp.experts.experts.5.linear_fc2.weight`) and its half (`…linear_fc1.weight_w`,
/// the gate, 0; `…weight_v`, the up projection, 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub key: String,
    pub layer: Option<u64>,
    pub expert: Option<u64>,
    pub half: Option<u8>,
}

/// [`Named`] of a saved tensor's name.
pub fn parse_name(name: &str) -> Named {
    let mut named = Named {
        key: name.to_owned(),
        layer: None,
        expert: None,
        half: None,
    };
    if let Some(rest) = name.strip_prefix(LAYERS)
        && let Some((index, tail)) = rest.split_once('.')
        && let Ok(layer) = index.parse::<u64>()
    {
        named.key = format!("{LAYERS}{tail}");
        named.layer = Some(layer);
    }
    // An expert saved apart: `…experts.experts.5.…` (singleton_local_shards),
    // `…experts.local_experts.5.…` (a SequentialMLP's state dict, fsdp_dtensor).
    const EXPERTS: &str = ".experts.experts.";
    for apart in [EXPERTS, ".experts.local_experts."] {
        if let Some(at) = named.key.find(apart)
            && let Some((index, tail)) = named.key[at + apart.len()..].split_once('.')
            && let Ok(expert) = index.parse::<u64>()
        {
            named.key = format!("{}{EXPERTS}{tail}", &named.key[..at]);
            named.expert = Some(expert);
        }
    }
    // A grouped GEMM's experts in its state dict (fsdp_dtensor):
    // `…experts.linear_fc2.weight5`, `…experts.linear_fc1.weight5_w`.
    const GROUPED: &str = ".experts.linear_fc";
    if let Some(at) = named.key.find(GROUPED)
        && let Some((module, param)) = named.key[at + ".experts.".len()..].split_once('.')
        && let Some((kind, rest)) = ["weight", "bias"]
            .iter()
            .find_map(|k| Some((*k, param.strip_prefix(k)?)))
    {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let (index, suffix) = rest.split_at(digits);
        if let Ok(expert) = index.parse::<u64>()
            && matches!(suffix, "" | "_w" | "_v")
        {
            named.key = format!("{}{EXPERTS}{module}.{kind}{suffix}", &named.key[..at]);
            named.expert = Some(expert);
        }
    }
    for (suffix, half) in [("_w", 0), ("_v", 1)] {
        if named.key.contains(".linear_fc1.")
            && let Some(base) = named.key.strip_suffix(suffix)
            && matches!(base.rsplit_once('.'), Some((_, "weight" | "bias")))
        {
            named.key = base.to_owned();
            named.half = Some(half);
        }
    }
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn singleton_local_shards_name_their_expert_and_half() {
        let named = parse_name("decoder.layers.3.mlp.experts.experts.5.linear_fc1.weight_v");
        assert_eq!(
            named,
            Named {
                key: "decoder.layers.mlp.experts.experts.linear_fc1.weight".to_owned(),
                layer: Some(3),
                expert: Some(5),
                half: Some(1),
            }
        );
        let dense = parse_name("decoder.layers.0.mlp.linear_fc1.weight_w");
        assert_eq!(
            (dense.key.as_str(), dense.expert, dense.half),
            ("decoder.layers.mlp.linear_fc1.weight", None, Some(0))
        );
        // Not a half: `_w` elsewhere, and the stacked experts' own name.
        assert_eq!(parse_name("decoder.layers.mlp.router.weight_w").half, None);
        let stacked = parse_name("decoder.layers.mlp.experts.experts.linear_fc2.weight");
        assert_eq!((stacked.expert, stacked.half), (None, None));
    }

    #[test]
    fn a_layer_saved_apart_is_named_by_its_index() {
        assert_eq!(
            key_of("decoder.layers.12.mlp.linear_fc2.weight"),
            ("decoder.layers.mlp.linear_fc2.weight".to_owned(), Some(12))
        );
        assert_eq!(
            key_of("decoder.layers.mlp.linear_fc2.weight"),
            ("decoder.layers.mlp.linear_fc2.weight".to_owned(), None)
        );
    }

    #[test]
    fn module_state_dicts_name_their_experts_globally() {
        // A SequentialMLP's state dict (fsdp_dtensor numbers its experts globally).
        let sequential =
            parse_name("decoder.layers.2.mlp.experts.local_experts.7.linear_fc1.weight_w");
        assert_eq!(
            sequential,
            Named {
                key: "decoder.layers.mlp.experts.experts.linear_fc1.weight".to_owned(),
                layer: Some(2),
                expert: Some(7),
                half: Some(0),
            }
        );
        // A grouped GEMM's: the expert after `weight`, before the half.
        let grouped = parse_name("decoder.layers.0.mlp.experts.linear_fc1.weight12_v");
        assert_eq!(
            (grouped.key.as_str(), grouped.expert, grouped.half),
            (
                "decoder.layers.mlp.experts.experts.linear_fc1.weight",
                Some(12),
                Some(1)
            )
        );
        let down = parse_name("decoder.layers.0.mlp.experts.linear_fc2.weight3");
        assert_eq!(
            (down.key.as_str(), down.expert, down.half),
            (
                "decoder.layers.mlp.experts.experts.linear_fc2.weight",
                Some(3),
                None
            )
        );
        // Not an expert: a shared expert's `linear_fc1`, a name with letters after `weight`.
        let shared = parse_name("decoder.layers.0.mlp.shared_experts.linear_fc1.weight_w");
        assert_eq!((shared.expert, shared.half), (None, Some(0)));
        assert_eq!(
            parse_name("decoder.layers.0.mlp.experts.linear_fc2.weightx").expert,
            None
        );
    }
}
