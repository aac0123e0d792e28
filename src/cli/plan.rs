//! `devmap plan`: the device map from_pretrained would make for the budgets, with
//! (`--context`) the KV cache each device holds beside the weights.

use std::path::Path;

use color_eyre::eyre::{Result, WrapErr, eyre};
use devmap::human_bytes;
use devmap::model::{Checkpoint, Placement};
use devmap::plan::kv::KvCache;

use super::args::{self, ModelArgs};
use super::open;
use super::output::{err_line, out};

/// `plan --json`: the plan with what it counted, for scripts.
fn plan_json(
    planned: &devmap::plan::Planned,
    options: &devmap::plan::PlanOptions,
    dtype: Option<devmap::model::DType>,
    kv: Option<&(KvCache, Vec<(Placement, u64)>)>,
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
    let devices: Vec<Value> = devices_with_kv(planned, kv.map_or(&[][..], |(_, on)| on))
        .iter()
        .map(|(p, bytes)| {
            let budget = options
                .max_memory
                .iter()
                .find(|(d, _)| d == p)
                .map(|(_, b)| *b);
            let kv_bytes = kv.map_or(0, |(_, on)| devmap::plan::reserve::on_device(on, *p));
            json!({
                "device": p.to_device_map_value(),
                "bytes": bytes,
                "kv_bytes": kv.map(|_| kv_bytes),
                "budget": budget,
                "over": budget.is_some_and(|b| bytes + kv_bytes > b),
            })
        })
        .collect();
    let value = json!({
        "mode": options.mode.name(),
        "dtype": dtype.map(devmap::model::DType::torch_name),
        "budgets": budgets,
        "weight_budgets": weight_budgets.map(|w| w
            .iter()
            .map(|(p, b)| (key(*p), Value::from(*b)))
            .collect::<Map<String, Value>>()),
        "device_map": device_map,
        "devices": devices,
        "explain": planned.explain,
        "heuristics": planned.heuristics,
        "kv_cache": kv.map(|(cache, _)| kv_json(cache)),
        "not_counted": not_counted(kv.map(|(cache, _)| cache)),
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
    let (planned, weight_budgets) = match (&cache, a.reserve_kv) {
        (Some(cache), true) => {
            let reserved = devmap::plan::reserve::plan_reserving_kv(&ckpt, &options, cache)?;
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
    let kv = cache.map(|cache| {
        let on = devmap::plan::reserve::kv_by_device(&ckpt, &planned.map, &cache);
        (cache, on)
    });
    if let (Some(kv), false) = (&kv, a.json) {
        for line in kv_lines(kv, &planned, &options, weight_budgets.as_deref()) {
            err_line(line)?;
        }
    }
    let text = if a.json {
        plan_json(
            &planned,
            &options,
            a.dtype,
            kv.as_ref(),
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
fn not_counted(kv: Option<&KvCache>) -> Vec<String> {
    let mut list = Vec::new();
    match kv {
        None => list.push("kv_cache".to_owned()),
        Some(cache) => list.extend(cache.not_counted.iter().map(|k| format!("kv_cache: {k}"))),
    }
    list.push("activations".to_owned());
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
fn kv_cache(ckpt: &Checkpoint, a: &args::PlanArgs, context: u64) -> Result<KvCache> {
    let request = devmap::plan::kv::KvRequest {
        context,
        batch: a.batch,
        dtype: devmap::plan::kv::compute_dtype(ckpt, a.dtype),
    };
    devmap::plan::kv::kv_cache(&ckpt.config.raw, request).map_err(|e| eyre!(e))
}

/// The report's lines: the cache, where it lives, and each device's weights + KV
/// against its budget.
fn kv_lines(
    (cache, on): &(KvCache, Vec<(Placement, u64)>),
    planned: &devmap::plan::Planned,
    options: &devmap::plan::PlanOptions,
    weight_budgets: Option<&[(Placement, u64)]>,
) -> Vec<String> {
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
    for (device, weights) in devices_with_kv(planned, on) {
        let kv = devmap::plan::reserve::on_device(on, device);
        let budget = options
            .max_memory
            .iter()
            .find(|(d, _)| *d == device)
            .map(|(_, b)| *b);
        lines.push(format!(
            "  {device}: weights {} + KV {} = {}{}",
            human_bytes(weights),
            human_bytes(kv),
            human_bytes(weights + kv),
            match budget {
                Some(b) if weights + kv > b => format!(" — OVER its {} budget", human_bytes(b)),
                Some(b) => format!(" ≤ {}", human_bytes(b)),
                None => String::new(),
            }
        ));
    }
    lines.extend(cache.notes.iter().map(|n| format!("  note: {n}")));
    lines
}

/// Each device that holds weights or cache, with its weights, in the plan's order (a
/// device holding only cache last).
fn devices_with_kv(
    planned: &devmap::plan::Planned,
    on: &[(Placement, u64)],
) -> Vec<(Placement, u64)> {
    let mut devices = planned.used.clone();
    for (p, _) in on {
        if !devices.iter().any(|(d, _)| d == p) {
            devices.push((*p, 0));
        }
    }
    devices
}
