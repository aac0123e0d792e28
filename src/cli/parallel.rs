//! `devmap plan --tp N [--ep N] [--pp N]`: each GPU's bytes as vLLM shards the model
//! (`devmap::plan::parallel`), in place of a device map.

use color_eyre::eyre::{Result, eyre};
use devmap::human_bytes;
use devmap::model::{Checkpoint, Placement};
use devmap::plan::parallel::{Layout, Sharded};

use super::args;
use super::output::{err_line, out};

/// Rank `rank`'s budget: GPU `rank`'s in --max-memory, or the one GPU budget given
/// for every rank.
fn budget_of(a: &args::PlanArgs, rank: u64) -> Option<u64> {
    let budgets = &a.max_memory.as_ref()?.0;
    let gpus: Vec<(Placement, u64)> = budgets
        .iter()
        .copied()
        .filter(|(p, _)| matches!(p, Placement::Gpu(_)))
        .collect();
    match gpus.as_slice() {
        [(_, b)] => Some(*b),
        _ => gpus
            .iter()
            .find(|(p, _)| *p == Placement::Gpu(rank as u32))
            .map(|(_, b)| *b),
    }
}

pub(super) fn report(ckpt: &Checkpoint, a: &args::PlanArgs, layout: Layout) -> Result<()> {
    let cache = a
        .context
        .map(|context| super::plan::kv_cache(ckpt, a, context))
        .transpose()?;
    let sharded = devmap::plan::parallel::shard(ckpt, layout, a.dtype, cache.as_ref())
        .map_err(|e| eyre!(e))?;
    for note in &sharded.notes {
        err_line(format!("note: {note}"))?;
    }
    if !sharded.replicated_unknown.is_empty() {
        err_line(format!(
            "note: counted whole on every rank (not a layer vLLM's Llama, Qwen, Mixtral or DeepSeek shards): {}",
            sharded.replicated_unknown.join(", ")
        ))?;
    }
    let text = if a.json {
        json(&sharded, a, cache.as_ref())
    } else {
        table(&sharded, a, cache.is_some())
    };
    out(&text)?;
    Ok(())
}

fn table(sharded: &Sharded, a: &args::PlanArgs, with_kv: bool) -> String {
    let Layout { tp, ep, pp } = sharded.layout;
    let mut text = format!(
        "vLLM layout: tp {tp}{}{} = {} GPUs\n",
        if ep > 1 {
            format!(", ep {ep}")
        } else {
            String::new()
        },
        if pp > 1 {
            format!(", pp {pp}")
        } else {
            String::new()
        },
        sharded.ranks.len()
    );
    text.push_str(&format!(
        "{:>4}  {:>5}  {:>3}  {:>3}  {:>9}  {:>11}  {:>11}  {:>11}\n",
        "rank", "stage", "tp", "ep", "layers", "weights", "KV", "total"
    ));
    for r in &sharded.ranks {
        let total = r.weights + r.kv;
        text.push_str(&format!(
            "{:>4}  {:>5}  {:>3}  {:>3}  {:>9}  {:>11}  {:>11}  {:>11}{}\n",
            r.rank,
            r.stage,
            r.tp_rank,
            r.ep_rank,
            format!("{}–{}", r.layers.0, r.layers.1.saturating_sub(1)),
            human_bytes(r.weights),
            if with_kv {
                human_bytes(r.kv)
            } else {
                "-".to_owned()
            },
            human_bytes(total),
            match budget_of(a, r.rank) {
                Some(b) if total > b => format!("  OVER its {} budget", human_bytes(b)),
                _ => String::new(),
            }
        ));
    }
    if let Some(r) = sharded.largest() {
        let total = r.weights + r.kv;
        text.push_str(&format!(
            "largest: rank {}, {}{}\n",
            r.rank,
            human_bytes(total),
            match budget_of(a, r.rank) {
                Some(b) if total > b => format!(" — OVER its {} budget", human_bytes(b)),
                Some(b) => format!(" ≤ {}", human_bytes(b)),
                None => String::new(),
            }
        ));
    }
    text
}

fn json(
    sharded: &Sharded,
    a: &args::PlanArgs,
    cache: Option<&devmap::plan::kv::KvCache>,
) -> String {
    use serde_json::json;
    let Layout { tp, ep, pp } = sharded.layout;
    let ranks: Vec<serde_json::Value> = sharded
        .ranks
        .iter()
        .map(|r| {
            let budget = budget_of(a, r.rank);
            json!({
                "rank": r.rank, "stage": r.stage, "tp_rank": r.tp_rank, "ep_rank": r.ep_rank,
                "layers": [r.layers.0, r.layers.1],
                "weights": r.weights,
                "kv_bytes": cache.map(|_| r.kv),
                "budget": budget,
                "over": budget.is_some_and(|b| r.weights + r.kv > b),
            })
        })
        .collect();
    let value = json!({
        "layout": {"tp": tp, "ep": ep, "pp": pp, "sharded_as": "vllm"},
        "dtype": a.dtype.map(devmap::types::DType::torch_name),
        "ranks": ranks,
        "largest": sharded.largest().map(|r| r.rank),
        "kv_cache": cache.map(|c| json!({
            "context": c.request.context, "batch": c.request.batch,
            "dtype": c.request.dtype.torch_name(), "bytes": c.bytes(),
        })),
        "replicated_unknown": sharded.replicated_unknown,
        "notes": sharded.notes,
        "not_counted": ["activations"],
    });
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}
