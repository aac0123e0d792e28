//! `devmap plan`: the device map from_pretrained would make for the budgets, with
//! (`--context`) the KV cache each device holds beside the weights.

use std::path::Path;

use color_eyre::eyre::{Result, WrapErr, eyre};
use devmap::human_bytes;
use devmap::model::{Checkpoint, Placement};
use devmap::plan::activation::Activations;
use devmap::plan::kv::KvCache;

use super::args::{self, ModelArgs};
use super::open;
use super::output::{err_line, out};

/// What runs beside the weights at `--context`: the KV cache, one forward's
/// activations (when the config says enough), and each device's share of both.
struct Runtime {
    cache: KvCache,
    act: Option<Activations>,
    /// Why the activations are not counted, when they are not.
    act_missing: Option<String>,
    kv_on: Vec<(Placement, u64)>,
    act_on: Vec<(Placement, u64)>,
    /// The weights each device holds while it runs (`weights_by_device`: no room kept
    /// free that no layer takes, the largest offloaded module on the execution device).
    weights_on: Vec<(Placement, u64)>,
}

impl Runtime {
    /// Device `p`'s weights, cache and activations while it runs.
    fn on(&self, p: Placement) -> (u64, u64, u64) {
        use devmap::plan::reserve::on_device;
        (
            on_device(&self.weights_on, p),
            on_device(&self.kv_on, p),
            on_device(&self.act_on, p),
        )
    }

    /// Every device holding any of them, in the plan's device order.
    fn devices(&self, planned: &devmap::plan::Planned) -> Vec<Placement> {
        let mut all: Vec<Placement> = planned.used.iter().map(|(p, _)| *p).collect();
        for (p, _) in self
            .weights_on
            .iter()
            .chain(&self.kv_on)
            .chain(&self.act_on)
        {
            if !all.contains(p) {
                all.push(*p);
            }
        }
        all
    }
}

/// `plan --json`: the plan with what it counted, for scripts.
fn plan_json(
    planned: &devmap::plan::Planned,
    options: &devmap::plan::PlanOptions,
    dtype: Option<devmap::types::DType>,
    runtime: Option<&Runtime>,
    weight_budgets: Option<&[(Placement, u64)]>,
) -> String {
    use serde_json::{Map, Value, json};
    let key = |p: devmap::model::Placement| match p.to_device_map_value() {
        Value::Number(n) => n.to_string(),
        other => other.as_str().unwrap_or_default().to_owned(),
    };
    let budgets: Map<String, Value> = options
        .max_memory
        .iter()
        .map(|(p, b)| (key(*p), Value::from(*b)))
        .collect();
    let device_map: Map<String, Value> = planned
        .map
        .entries()
        .iter()
        .map(|(k, p)| (k.clone(), p.to_device_map_value()))
        .collect();
    let listed: Vec<(Placement, u64)> = match runtime {
        Some(r) => r
            .devices(planned)
            .into_iter()
            .map(|p| (p, devmap::plan::reserve::on_device(&planned.used, p)))
            .collect(),
        None => planned.used.clone(),
    };
    let devices: Vec<Value> = listed
        .iter()
        .map(|(p, bytes)| {
            let budget = options
                .max_memory
                .iter()
                .find(|(d, _)| d == p)
                .map(|(_, b)| *b);
            // At --context, what the device holds while it runs; else the planner's count.
            let (held, kv_bytes, act_bytes) = runtime.map_or((*bytes, 0, 0), |r| r.on(*p));
            json!({
                "device": p.to_device_map_value(),
                "bytes": bytes,
                "weight_bytes": runtime.map(|_| held),
                "kv_bytes": runtime.map(|_| kv_bytes),
                "activation_bytes": runtime.and_then(|r| r.act.as_ref()).map(|_| act_bytes),
                "budget": budget,
                "over": budget.is_some_and(|b| held + kv_bytes + act_bytes > b),
            })
        })
        .collect();
    let value = json!({
        "mode": options.mode.name(),
        "dtype": dtype.map(devmap::types::DType::torch_name),
        "budgets": budgets,
        "weight_budgets": weight_budgets.map(|w| w
            .iter()
            .map(|(p, b)| (key(*p), Value::from(*b)))
            .collect::<Map<String, Value>>()),
        "device_map": device_map,
        "devices": devices,
        "explain": planned.explain,
        "heuristics": planned.heuristics,
        "kv_cache": runtime.map(|r| kv_json(&r.cache)),
        "activations": runtime.and_then(|r| r.act.as_ref()).map(|a| json!({
            "tokens": a.tokens, "batch": a.batch, "dtype": a.dtype.torch_name(),
            "per_layer": a.per_layer, "logits": a.logits, "mask": a.mask, "notes": a.notes,
        })),
        "not_counted": not_counted(runtime),
    });
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

pub(super) fn plan(a: &args::PlanArgs, model: &ModelArgs) -> Result<()> {
    // `--device-map auto|balanced|balanced_low_0|sequential` is from_pretrained's
    // `device_map` string, not a map file to read.
    let named_mode = model
        .device_map
        .as_deref()
        .and_then(|p| p.to_str())
        .filter(|p| !Path::new(p).exists())
        .and_then(devmap::plan::PlanMode::parse);
    let mut model = model.clone();
    if named_mode.is_some() {
        model.device_map = None;
    }
    let mode = named_mode.unwrap_or_default();
    let mut ckpt = open(&a.dir, &model)?;
    if a.tp.is_some() || a.ep.is_some() || a.pp.is_some() {
        let layout = devmap::plan::parallel::Layout {
            tp: a.tp.unwrap_or(1),
            ep: a.ep.unwrap_or(1),
            pp: a.pp.unwrap_or(1),
        };
        return super::parallel::report(&ckpt, a, layout);
    }
    let max_memory = if let Some(m) = &a.max_memory {
        m.0.clone()
    } else {
        let detected = devmap::plan::default_budgets(&devmap::monitor::detected_budgets(), mode);
        err_line(format!(
            "budgets (detected; give --max-memory to choose): {}",
            detected
                .iter()
                .map(|(p, b)| format!("{p}={}", human_bytes(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        ))?;
        detected
    };
    let options = devmap::plan::PlanOptions {
        max_memory,
        no_split: a.no_split.clone(),
        dtype: a.dtype,
        mode,
    };
    let cache = match a.context {
        Some(context) => Some(kv_cache(&ckpt, a, context)?),
        None if a.reserve_kv => {
            return Err(eyre!(
                "--reserve-kv needs --context N: the cache to reserve room for"
            ));
        }
        None => None,
    };
    let act = match (&cache, a.context) {
        (Some(cache), Some(context)) => Some(devmap::plan::activation::activations(
            &ckpt.config.raw,
            a.prefill.unwrap_or(context),
            a.batch,
            cache.request.dtype,
        )),
        _ => None,
    };
    let (planned, weight_budgets) = match (&cache, a.reserve_kv) {
        (Some(cache), true) => {
            let reserved = devmap::plan::reserve::plan_reserving_kv(
                &ckpt,
                &options,
                cache,
                act.as_ref().and_then(|a| a.as_ref().ok()),
            )?;
            (reserved.planned, Some(reserved.weight_budgets))
        }
        _ => (devmap::plan::plan(&ckpt, &options)?, None),
    };
    // A plan from name heuristics may differ from accelerate's: said in the normal
    // output, not only under --explain (where it is the first line anyway).
    if let (Some(note), false) = (&planned.heuristics, a.explain) {
        err_line(format!("warning: {note}"))?;
    }
    if a.explain {
        for line in &planned.explain {
            err_line(line)?;
        }
    }
    let runtime = cache.map(|cache| {
        let kv_on = devmap::plan::reserve::kv_by_device(&ckpt, &planned.map, &cache);
        let (act, act_missing) = match act {
            Some(Ok(act)) => (Some(act), None),
            Some(Err(why)) => (None, Some(why)),
            None => (None, None),
        };
        let act_on = act.as_ref().map_or_else(Vec::new, |act| {
            devmap::plan::activation::activations_by_device(
                &ckpt,
                &planned.map,
                act,
                cache.layers.len(),
            )
        });
        Runtime {
            weights_on: devmap::plan::reserve::weights_by_device(&ckpt, &planned.map, a.dtype),
            cache,
            act,
            act_missing,
            kv_on,
            act_on,
        }
    });
    if let (Some(runtime), false) = (&runtime, a.json) {
        for line in kv_lines(runtime, &planned, &options, weight_budgets.as_deref()) {
            err_line(line)?;
        }
    }
    let text = if a.json {
        plan_json(
            &planned,
            &options,
            a.dtype,
            runtime.as_ref(),
            weight_budgets.as_deref(),
        )
    } else {
        devmap::formats::device_map::encode_device_map(&planned.map)
    };
    match &a.out {
        Some(path) => {
            if ckpt
                .device_map_path
                .as_deref()
                .is_some_and(|input| devmap::formats::input::same_file(input, path))
            {
                return Err(eyre!(
                    "{} is the input device map; devmap never writes its inputs: choose another --out",
                    path.display()
                ));
            }
            std::fs::write(path, &text)
                .wrap_err_with(|| format!("cannot write {}", path.display()))?;
            eprintln!("device map written to {}", path.display());
        }
        None => out(&text)?,
    }
    // What the planned map implies: ties split across devices and the like.
    ckpt.apply_device_map(Some(planned.map));
    for w in devmap::model::checks::ties_across_devices(&ckpt) {
        err_line(format!("warning: {w}"))?;
    }
    // With --reserve-kv, transformers is asked with the budgets the weights were
    // planned against.
    let asked = devmap::plan::PlanOptions {
        max_memory: weight_budgets.unwrap_or(options.max_memory.clone()),
        ..options
    };
    compare_with_transformers(&ckpt, &asked, &model)
}

/// With `--transformers PYTHON` (only then: the question is not cached, and takes
/// seconds), what that transformers' own planner makes of the same model and budgets,
/// compared tensor by tensor with devmap's plan (already applied to `ckpt`).
fn compare_with_transformers(
    ckpt: &Checkpoint,
    options: &devmap::plan::PlanOptions,
    model: &ModelArgs,
) -> Result<()> {
    let Some(flag) = model.transformers.as_deref() else {
        return Ok(());
    };
    let oracle = devmap::oracle::Oracle::find(Some(flag), model.trust_remote_code)
        .map_err(|e| eyre!(e))
        .wrap_err("--transformers names a Python that cannot answer")?;
    let config_dir = ckpt.config_dir.clone().unwrap_or_else(|| ckpt.dir.clone());
    let Some(oracle) = oracle.filter(|_| config_dir.join("config.json").is_file()) else {
        return Ok(());
    };
    let theirs = match oracle.plan(
        &config_dir,
        options.dtype,
        options.mode.name(),
        &options.max_memory,
    ) {
        Ok(map) => map,
        Err(e) => {
            err_line(format!(
                "warning: {e}; devmap's plan is not compared with transformers'"
            ))?;
            return Ok(());
        }
    };
    // Each tensor placed by their map as `apply_device_map` places it, without a copy
    // of the checkpoint.
    let theirs = devmap::model::DeviceMap::new(theirs);
    let arch = devmap::model::arch::lookup(&ckpt.config.architectures);
    let differ: Vec<String> = ckpt
        .tensors()
        .iter()
        .filter_map(|t| {
            let (there, _) = devmap::model::checkpoint::place(Some(&theirs), &t.name, arch);
            (there != t.placement)
                .then(|| format!("`{}` devmap {}, transformers {there}", t.name, t.placement))
        })
        .collect();
    let who = format!(
        "transformers {}, asked ({})",
        oracle.version,
        oracle.found_where()
    );
    if differ.is_empty() {
        err_line(format!("{who} plans every tensor where devmap does"))?;
    } else {
        err_line(format!(
            "warning: {who} plans {} elsewhere: {}{}",
            devmap::text::count(differ.len(), "tensor", "tensors"),
            differ
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
            if differ.len() > 5 { "; …" } else { "" }
        ))?;
    }
    Ok(())
}

/// What `plan --json` says it did not count.
fn not_counted(runtime: Option<&Runtime>) -> Vec<String> {
    let mut list = Vec::new();
    match runtime {
        None => list.extend(["kv_cache".to_owned(), "activations".to_owned()]),
        Some(r) => {
            list.extend(r.cache.not_counted.iter().map(|k| format!("kv_cache: {k}")));
            if let Some(why) = &r.act_missing {
                list.push(format!("activations: {why}"));
            }
        }
    }
    list
}

fn kv_json(cache: &KvCache) -> serde_json::Value {
    serde_json::json!({
        "context": cache.request.context,
        "batch": cache.request.batch,
        "dtype": cache.request.dtype.torch_name(),
        "bytes": cache.bytes(),
        "layers": cache.layers.iter().map(|l| serde_json::json!({
            "kind": l.kind, "tokens": l.tokens, "bytes": l.bytes,
        })).collect::<Vec<_>>(),
        "notes": cache.notes,
    })
}

/// The KV cache at `context` tokens, in the dtype the model computes in.
pub(super) fn kv_cache(ckpt: &Checkpoint, a: &args::PlanArgs, context: u64) -> Result<KvCache> {
    let request = devmap::plan::kv::KvRequest {
        context,
        batch: a.batch,
        dtype: devmap::plan::kv::compute_dtype(ckpt, a.dtype),
    };
    devmap::plan::kv::kv_cache(&ckpt.config.raw, request).map_err(|e| eyre!(e))
}

/// The report's lines: the cache and the activations, where they live, and each
/// device's weights + KV + activations against its budget.
fn kv_lines(
    runtime: &Runtime,
    planned: &devmap::plan::Planned,
    options: &devmap::plan::PlanOptions,
    weight_budgets: Option<&[(Placement, u64)]>,
) -> Vec<String> {
    let cache = &runtime.cache;
    let r = cache.request;
    let mut lines = vec![format!(
        "KV cache at {} × {}, {}: {}{}",
        devmap::text::count(r.context as usize, "token", "tokens"),
        devmap::text::count(r.batch as usize, "sequence", "sequences"),
        r.dtype.torch_name(),
        human_bytes(cache.bytes()),
        if cache.not_counted.is_empty() {
            String::new()
        } else {
            format!(" (not counted: {})", cache.not_counted.join(", "))
        }
    )];
    match (&runtime.act, &runtime.act_missing) {
        (Some(act), _) => lines.push(format!(
            "activations of a {}-token forward: {} while a layer computes, on its device (estimate)",
            act.tokens,
            human_bytes(act.per_layer)
        )),
        (None, Some(why)) => lines.push(format!("activations not counted: {why}")),
        (None, None) => {}
    }
    if let Some(lowered) = weight_budgets {
        lines.push(format!(
            "  --reserve-kv: weights planned against {} (from_pretrained's max_memory for this map)",
            lowered
                .iter()
                .map(|(p, b)| format!("{p}={}", human_bytes(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for device in runtime.devices(planned) {
        let (weights, kv, act) = runtime.on(device);
        let total = weights + kv + act;
        let budget = options
            .max_memory
            .iter()
            .find(|(d, _)| *d == device)
            .map(|(_, b)| *b);
        lines.push(format!(
            "  {device}: weights {} + KV {}{} = {}{}",
            human_bytes(weights),
            human_bytes(kv),
            if runtime.act.is_some() {
                format!(" + activations {}", human_bytes(act))
            } else {
                String::new()
            },
            human_bytes(total),
            match budget {
                Some(b) if total > b => format!(" — OVER its {} budget", human_bytes(b)),
                Some(b) => format!(" ≤ {}", human_bytes(b)),
                None => String::new(),
            }
        ));
    }
    lines.extend(cache.notes.iter().map(|n| format!("  note: {n}")));
    if let Some(act) = &runtime.act {
        lines.extend(act.notes.iter().map(|n| format!("  note: {n}")));
    }
    lines
}
