//! Unit tests of `expect`.

use super::*;

#[test]
fn ignore_expressions_search_as_python_re_does() {
    // transformers' own `_keys_to_ignore_on_load_*` forms.
    assert_eq!(
        regex_search(r"attn\.masked_bias", "h.0.attn.masked_bias"),
        Some(true)
    );
    assert_eq!(
        regex_search(r"^lm_head\.weight$", "model.lm_head.weight"),
        Some(false)
    );
    assert_eq!(
        regex_search(r"h\.\d+\.attn\.bias", "h.12.attn.bias"),
        Some(true)
    );
    assert_eq!(
        regex_search(r"h\.\d+\.attn\.bias", "h.x.attn.bias"),
        Some(true),
        "\\d+ is read as any run"
    );
    assert_eq!(
        regex_search(r"(decoder|encoder)\.version", "decoder.version"),
        Some(true)
    );
    assert_eq!(regex_search(r"(?:a|b)\.w", "c.w"), Some(false));
    // More syntax than devmap matches: unknown, so never ignored.
    assert_eq!(regex_search(r"layers\.[0-9]{2}\.w", "layers.10.w"), None);
}

const BLOCK: &str = "default hidden_size 64\ndefault num_hidden_layers 2\ndefault tie_word_embeddings false\nform saved\nmodel.embed.weight [vocab_size,hidden_size]\nlm_head.weight [vocab_size,hidden_size] tied?\nlist model.layers num_hidden_layers\n variant @0\n  bias [?]\n  list experts 4\n   variant\n    w [2*hidden_size/4]\n variant\n  w [hidden_size,hidden_size]\nform runtime\nmodel.embed.weight [vocab_size,hidden_size]\n";

/// Qwen3-MoE's config.json says `num_experts`; its config class's attribute is
/// `num_local_experts` (an `attribute_map` alias): the count is config.json's, not
/// the default (a false alarm on every Qwen3-MoE with other than 128 experts).
#[test]
fn an_attribute_given_under_its_alias_is_read() {
    let e = parse_block(
        "default num_local_experts 128\nalias num_experts num_local_experts\nform saved\n",
    );
    let config = serde_json::json!({"num_experts": 4});
    assert_eq!(e.values(&config).attribute("num_local_experts"), Some(4));
    let canonical = serde_json::json!({"num_local_experts": 8, "num_experts": 4});
    assert_eq!(e.values(&canonical).attribute("num_local_experts"), Some(8));
    let neither = serde_json::json!({});
    assert_eq!(e.values(&neither).attribute("num_local_experts"), Some(128));
}

#[test]
fn a_block_parses_into_forms_lists_and_pinned_variants() {
    let e = parse_block(BLOCK);
    assert_eq!(e.ties_by_default, Some(false));
    let root = &e.saved.root;
    assert_eq!(root.tensors.len(), 2);
    assert_eq!(root.tensors[1].tied, Tied::IfTiedWords);
    let layers = &root.lists[0];
    assert_eq!(layers.path, "model.layers");
    assert_eq!(layers.variants.len(), 2);
    assert_eq!(layers.variants[0].pinned, Some(vec![0]));
    assert_eq!(layers.variants[1].pinned, None);
    let experts = &layers.variants[0].node.lists[0];
    assert_eq!(experts.path, "experts");
    assert_eq!(
        experts.variants[0].node.tensors[0].dims[0].to_string(),
        "2*hidden_size/4"
    );
    assert_eq!(e.runtime.as_ref().map(|f| f.root.tensors.len()), Some(1));
}

#[test]
fn a_list_whose_members_are_tensors_ends_where_its_lines_do() {
    // Reformer: `position_embeddings.weights.0` and `.1` are tensors, written with
    // no name; the list of layers after them is not inside that list.
    let block = "form saved\nw [4]\nlist emb.weights 2\n variant @0,1\n   [?,?,?]\nlist layers n\n variant\n  a [4]\n";
    let e = parse_block(block);
    let root = &e.saved.root;
    assert_eq!(root.lists.len(), 2, "{root:?}");
    let member = &root.lists[0].variants[0].node.tensors[0];
    assert_eq!(member.full_name("emb.weights.0."), "emb.weights.0");
    assert_eq!(member.dims.len(), 3);
    assert_eq!(root.lists[1].path, "layers");
}

#[test]
fn buffers_are_sized_by_the_config_and_left_out_where_it_cannot_say() {
    let block = "default head_dim hidden_size/num_attention_heads\ndefault max_position_embeddings 512\ndefault num_attention_heads 4\ndefault num_layers 3\nform saved\nw [4]\nform buffers\nmodel.rotary_emb.inv_freq [head_dim/2] F32\nembeddings.position_ids [1,max_position_embeddings] I64\nlist h num_layers\n variant\n  attn.bias [1,1,max_position_embeddings,max_position_embeddings] BOOL\nlist local 2\n variant\n  mask [4] BOOL\n variant\n  mask [8] BOOL\n";
    let e = parse_block(block);
    let config = serde_json::json!({"head_dim": 64, "num_layers": 2});
    let got = e.buffers(&config);
    let named: Vec<(&str, DType, &[u64])> = got
        .iter()
        .map(|b| (b.name.as_str(), b.dtype, b.shape.as_slice()))
        .collect();
    assert_eq!(
        named,
        vec![
            ("model.rotary_emb.inv_freq", DType::F32, &[32][..]),
            ("embeddings.position_ids", DType::I64, &[1, 512][..]),
            ("h.0.attn.bias", DType::Bool, &[1, 1, 512, 512][..]),
            ("h.1.attn.bias", DType::Bool, &[1, 1, 512, 512][..]),
        ]
    );
    // head_dim not given: derived as the config class derives it, from
    // config.json's attributes or their defaults.
    let derived = e.buffers(&serde_json::json!({"hidden_size": 256}));
    assert_eq!(derived[0].name, "model.rotary_emb.inv_freq");
    assert_eq!(derived[0].shape, vec![32]);
    assert_eq!(derived.len(), 5);
    let two_heads = serde_json::json!({"hidden_size": 256, "num_attention_heads": 2});
    assert_eq!(e.values(&two_heads).attribute("head_dim"), Some(128));
    // A derivation that cannot be evaluated leaves that buffer out.
    let unknown = e.buffers(&serde_json::json!({"hidden_size": null}));
    assert!(
        unknown
            .iter()
            .all(|b| b.name != "model.rotary_emb.inv_freq")
    );
    // The saved form is not affected by the buffers.
    assert_eq!(e.saved.root.tensors.len(), 1);
    assert!(e.saved.root.tensors[0].dtype.is_none());
}

#[test]
fn sizes_come_from_config_json_then_the_defaults() {
    let e = parse_block(BLOCK);
    let config = serde_json::json!({"vocab_size": 100, "sub": {"n": 3}, "head_dim": null});
    let v = e.values(&config);
    assert_eq!(v.attribute("vocab_size"), Some(100));
    assert_eq!(v.attribute("hidden_size"), Some(64));
    assert_eq!(v.attribute("sub.n"), Some(3));
    assert_eq!(v.attribute("head_dim"), None);
    assert_eq!(v.eval(&parse_expr("2*hidden_size/4")), Some(32));
    assert_eq!(v.eval(&parse_expr("hidden_size/3")), None);
    assert_eq!(v.eval(&parse_expr("?")), None);
    assert!(!v.ties_words());
    let tied = serde_json::json!({"tie_word_embeddings": true});
    assert!(e.values(&tied).ties_words());
}

#[test]
fn ignore_patterns_match_as_re_search_does() {
    assert!(glob_search("final_logits_bias", "final_logits_bias"));
    assert!(glob_search(
        "inv_freq",
        "model.layers.0.self_attn.rotary_emb.inv_freq"
    ));
    assert!(glob_search("^mtp*", "mtp.layers.0.w"));
    assert!(!glob_search("^mtp*", "model.mtp.w"));
    assert!(glob_search(".mtp.*", "model.mtp.w"));
    assert!(glob_search("model.layers.61*", "model.layers.61.mlp.w"));
    assert!(glob_search("swin?layernorm*", "swin.layernorm.weight"));
    assert!(glob_search("w$", "a.w"));
    assert!(!glob_search("w$", "a.w.bias"));
    let e = parse_block("ignore-missing final_logits_bias\nignore-unexpected ^mtp*\nform saved\n");
    assert!(e.ignores_missing("final_logits_bias"));
    assert!(e.ignores_unexpected("mtp.0.w"));
    assert!(!e.ignores_unexpected("model.mtp.0.w"));
}

#[test]
fn the_embedded_table_has_the_common_families() {
    for arch in [
        "LlamaForCausalLM",
        "MixtralForCausalLM",
        "T5ForConditionalGeneration",
    ] {
        let e = lookup(&[arch.to_owned()]).expect(arch);
        assert!(!e.saved.root.lists.is_empty(), "{arch}");
    }
}
